"""nccl-tests (github.com/NVIDIA/nccl-tests), one subject: `command` (a binary's argv and where it
is, for the plan), `output` and `json_format` (its text and -J outputs parsed into rows), `infer`
(which collective an output measured), `importer` (rows into records; saved outputs imported)."""
