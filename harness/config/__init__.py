"""The configuration, in four modules a newcomer can name: choices (the Enums a field takes), schema (the
typed dataclass tree and REPO_ROOT), validate (every check, naming field, value and what is valid) and
compose (conf/ plus Hydra overrides into a validated BenchConfig: the only module that runs Hydra).

Import from the module that holds a name; this package imports none of them, so that no module
importing the schema depends on validation (harness.config.teacher is imported by validate and imports the
schema)."""
