"""The Apptainer definitions written from the Dockerfiles (containers/apptainer_def.py): every ENV,
COPY/ADD, RUN and LABEL of each Dockerfile has its counterpart in the definition (the Dockerfile read
by the image check's own parser, the definition as Apptainer reads one: header keywords before the
first %section, a label's key up to its first space); the wheelhouse is in %files, the labels name the
lock's sha256, the header lists the adapted instructions; a failing RUN stops %post as it stops a
docker build. No apptainer needed: building from them is tests/unit/test_containers.py (the stand-in)."""
from __future__ import annotations

import hashlib
import re
import shlex
import subprocess

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)
from unit_helpers import REPO_ROOT, VENV_PYTHON

from containers import apptainer_def, base_image, image_stack, wheelhouse
from harness.launch.container import ROUTE_LABEL


def read_def(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(header keywords, {section: lines}) as Apptainer's parser splits a definition
    (pkg/build/types/parser/deffile.go: a line whose first word starts with % opens a section;
    comment lines in the header are skipped)."""
    header: dict[str, str] = {}
    body: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        word = line.split(None, 1)[0] if line.strip() else ""
        if word.startswith("%"):
            current = body.setdefault(word[1:].lower(), [])
        elif current is not None:
            current.append(line)
        elif word and not word.startswith("#"):
            key, _, value = line.partition(":")
            header[key.strip().lower()] = value.strip()
    return header, body


def labels_of(body: dict[str, list[str]]) -> dict[str, str]:
    out = {}
    for line in body.get("labels", []):
        key, _, value = line.strip().partition(" ")
        if key:
            out[key] = value.strip()
    return out


def files_of(body: dict[str, list[str]]) -> list[tuple[str, str]]:
    return [tuple(shlex.split(ln)) for ln in body.get("files", []) if ln.strip()]   # type: ignore[misc]


def flat(text: str) -> str:
    """A shell script with its continuations joined and its whitespace collapsed."""
    return re.sub(r"\s+", " ", text.replace("\\\n", " ")).strip()


def dockerfile(image: str) -> list[tuple[str, str]]:
    return image_stack.instructions(apptainer_def.dockerfile_of(image).read_text(encoding="utf-8"))


def in_def(image: str, defn: apptainer_def.Definition, value: str) -> str:
    """A Dockerfile word as the definition must have it: ARGs substituted, the wheelhouse moved."""
    for name, v in defn.values.items():
        value = value.replace("${" + name + "}", v).replace("$" + name, v)
    return value.replace(apptainer_def.DOCKER_WHEELHOUSE, apptainer_def.WHEELHOUSE_DEST)


@pytest.fixture(scope="module", params=apptainer_def.IMAGES)
def converted(request):
    defn = apptainer_def.generate(request.param)
    return request.param, defn, *read_def(defn.text)


def test_every_env_copy_run_and_label_has_its_counterpart(converted):
    image, defn, header, body = converted
    post = "\n".join(body["post"])
    environment = body["environment"]
    files = files_of(body)
    with_its_folder = {src for a in defn.adapted if a.instruction.startswith("COPY of files a later COPY")
                       for src in a.how.split(": ", 1)[1].split(", ")}
    labels = labels_of(body)
    at = 0   # ENV and RUN keep their Dockerfile order in %post
    seen = {"ENV": 0, "COPY": 0, "RUN": 0, "LABEL": 0}
    for keyword, args in dockerfile(image):
        if keyword == "ENV":
            for pair in shlex.split(args):
                line = f"export {in_def(image, defn, pair)}"
                assert line in environment, f"ENV {pair}: no `{line}` in %environment"
                found = post.find(line, at)
                assert found >= 0, f"ENV {pair}: no `{line}` in %post after the previous step"
                at = found
        elif keyword in ("COPY", "ADD"):
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            for src in words[:-1]:
                pair = (in_def(image, defn, src), in_def(image, defn, words[-1]).rstrip("/")
                        if words[-1].rstrip("/") == apptainer_def.DOCKER_WHEELHOUSE else words[-1])
                if src in with_its_folder:   # copied by the COPY of its folder: %files copies all before %post
                    assert apptainer_def._copied_with_its_folder(*pair, [list(f) for f in files]), \
                        f"{keyword} {src}: left out, but no folder of it in %files"
                    continue
                assert pair in files, f"{keyword} {src} {words[-1]}: no `{' '.join(pair)}` in %files"
        elif keyword == "RUN":
            script = flat(in_def(image, defn, args))
            wrapped = flat(post[at:])
            assert f"( {script} ) || exit $?" in wrapped, f"RUN {args[:60]}...: not in %post (in its subshell) in order"
            at = post.find(script.split(" ")[0], at) + 1
        elif keyword == "LABEL":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                assert labels.get(key) == in_def(image, defn, value), f"LABEL {key}: %labels has {labels.get(key)!r}"
        else:
            continue
        seen[keyword] += 1
    assert all(seen.values()), f"the Dockerfile of {image} has none of some instruction: {seen}"
    for name in defn.values:   # no ARG is left for Apptainer to guess
        sections_text = "\n".join("\n".join(v) for v in body.values())
        assert "${" + name + "}" not in sections_text and not re.search(r"\$" + name + r"\b", sections_text)
    assert "{{" not in defn.text, "Apptainer would read {{ }} as a build argument"


def test_the_wheelhouse_is_copied_in_installed_from_and_removed(converted):
    image, defn, header, body = converted
    post = "\n".join(body["post"])
    assert (f"build/wheelhouse/{image}", apptainer_def.WHEELHOUSE_DEST) in files_of(body)
    assert f"--no-index --find-links={apptainer_def.WHEELHOUSE_DEST}" in post
    assert f"rm -rf {apptainer_def.WHEELHOUSE_DEST}" in post
    assert apptainer_def.DOCKER_WHEELHOUSE not in "\n".join(body["files"] + body["post"]), \
        "the host's /tmp is bound over the container's during %post"


def test_labels_name_the_locks_sha256_the_base_and_the_route(converted):
    image, defn, header, body = converted
    labels = labels_of(body)
    lock = wheelhouse.TARGETS[image].lock
    assert labels["llm-pretrain-bench.lock.sha256"] == hashlib.sha256(lock.read_text(encoding="utf-8").encode()).hexdigest()
    assert labels[ROUTE_LABEL] == "def"
    assert labels["org.opencontainers.image.base.name"] == header["from"]
    assert labels["llm-pretrain-bench.definition.source"] == f"containers/Dockerfile.{image}"


def test_the_base_is_the_dockerfiles_pinned_default(converted):
    image, defn, header, body = converted
    pinned = re.search(r"^ARG BASE_IMAGE=(\S+)", apptainer_def.dockerfile_of(image).read_text(), flags=re.M)[1]
    assert header["bootstrap"] == "docker" and header["from"] == pinned
    digest = re.search(r"@(sha256:[0-9a-f]{64})$", pinned)
    assert labels_of(body)["llm-pretrain-bench.base.id"] == (digest[1] if digest else "unknown (not pinned by digest)")
    if not digest:   # the gpu image's CUDA base: said in the header
        assert "NOT pinned by digest" in defn.text.split("Bootstrap:")[0]


def test_the_header_lists_each_adapted_instruction_and_why(converted):
    image, defn, header, body = converted
    head = defn.text[:defn.text.index("\nBootstrap:")]
    assert all(ln.startswith("#") or not ln.strip() for ln in head.splitlines())
    m = re.search(r"^# Adapted instructions \((\d+)\):$", head, flags=re.M)
    listed = head[m.end():] if m else ""
    assert m and int(m[1]) == len(defn.adapted) == len(re.findall(r"^#   \S", listed, flags=re.M))
    assert listed.count("#       because ") == len(defn.adapted)
    for instruction in ("FROM ${BASE_IMAGE}", "ARG ", "RUN ", "ENV ", "COPY ${WHEELHOUSE} /tmp/wheelhouse",
                        "WORKDIR /workspace/suite", "LABEL "):
        assert f"#   {instruction}" in listed, f"{instruction}: not listed as adapted"


def test_a_failing_run_stops_post_as_it_stops_a_docker_build(tmp_path):
    """sh -e does not stop at a failure inside an && chain: spython's %post would go on and build a
    broken image. Each RUN in its own subshell, its status checked, stops it; ENV is exported."""
    df = tmp_path / "Dockerfile.cpu"
    df.write_text("ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:" + "a" * 64 + "\nFROM ${BASE_IMAGE}\n"
                  "ARG BASE_ID=unknown\nARG LOCK_SHA256=unknown\nARG WHEELHOUSE=build/wheelhouse/cpu\n"
                  f"ENV MARK={tmp_path}/ran\n"
                  'RUN sh -c \'test -n "$MARK"\' \\\n && false \\\n && echo never\n'
                  'RUN touch "$MARK"\n')
    defn = apptainer_def.generate("cpu", dockerfile=df)
    post = "\n".join(read_def(defn.text)[1]["post"])
    done = subprocess.run(["sh", "-e", "-c", post], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and not (tmp_path / "ran").exists(), "the RUN after the failed one ran"
    raw = 'sh -c \'test -n "$MARK"\' && false && echo never\ntouch "$MARK"'   # spython's %post, unwrapped
    assert subprocess.run(["sh", "-e", "-c", raw], env={"MARK": str(tmp_path / "ran"), "PATH": "/usr/bin:/bin"}).returncode == 0
    assert (tmp_path / "ran").exists(), "sh -e goes on after a failure inside an && chain"
    (tmp_path / "ran").unlink()
    ok = post.replace("&& false", "&& true")
    assert subprocess.run(["sh", "-e", "-c", ok], cwd=tmp_path).returncode == 0 and (tmp_path / "ran").exists()


@pytest.mark.parametrize("text, why", [
    ("FROM ${BASE_IMAGE} AS a\nFROM a\n", "more than one FROM"),
    ("FROM ${BASE_IMAGE}\nADD x.tar.gz /x\n", "ADD"),
    ("FROM ${BASE_IMAGE}\nRUN [\"true\"]\n", "exec form"),
    ("FROM ${BASE_IMAGE}\nRUN true \\\n# a comment\n && true\n", "comment inside a continued RUN"),
    ("FROM ${BASE_IMAGE}\nARG OTHER=1\n", "ARG OTHER: no value"),
])
def test_what_the_conversion_cannot_carry_is_refused_by_name(tmp_path, text, why):
    df = tmp_path / "Dockerfile.cpu"
    df.write_text("ARG BASE_IMAGE=python:3.11-slim-bookworm\n" + text)
    with pytest.raises(apptainer_def.DefinitionError, match=why):
        apptainer_def.generate("cpu", dockerfile=df)


def test_the_debootstrap_base_is_make_base_images():
    defn = apptainer_def.generate("cpu", cpu_base="debootstrap")
    header, body = read_def(defn.text)
    assert header == {"bootstrap": "debootstrap", "osversion": base_image.SUITE, "mirrorurl": base_image.MIRROR,
                      "include": " ".join(base_image.PACKAGES)}
    assert labels_of(body)["org.opencontainers.image.base.name"] == f"debootstrap:{base_image.SUITE}"
    with pytest.raises(apptainer_def.DefinitionError, match="only the cpu image"):
        apptainer_def.generate("gpu", cpu_base="debootstrap")


def test_written_definitions_and_check_from_the_command_line(tmp_path):
    run = [VENV_PYTHON, "-m", "containers.apptainer_def", "--out", str(tmp_path)]
    done = subprocess.run(run + ["--check"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "stale or missing" in done.stdout
    done = subprocess.run(run, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "llm-pretrain-bench-cpu.def: from containers/Dockerfile.cpu" in done.stdout
    for image in apptainer_def.IMAGES:
        assert (tmp_path / f"llm-pretrain-bench-{image}.def").read_text() == apptainer_def.generate(image).text
    done = subprocess.run(run + ["--check"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.count("up to date") == len(apptainer_def.IMAGES)


def test_a_file_copied_ahead_of_its_folder_is_not_copied_into_it_again(converted):
    """The Dockerfiles copy benchmarks/node/ops.py (and its packages' __init__) ahead of the suite, so
    that DeepSpeed's ops are built in a layer of their own; %files keeps only the folder's copy: a
    second `cp -r benchmarks /workspace/suite/benchmarks` into the folder the first made would nest it."""
    image, defn, header, body = converted
    files = files_of(body)
    assert ("benchmarks", "/workspace/suite/benchmarks") in files
    assert not any(src.startswith("benchmarks/") for src, _ in files), files
    assert "left out of %files: benchmarks/__init__.py, benchmarks/node/__init__.py, benchmarks/node/ops.py" in defn.text
