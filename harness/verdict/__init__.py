"""The verdict side: records read (`record_files`, the one loader), judged against reference tables
(`references`, `compare`), against other records (`ab`) or this machine's own earlier runs
(`baseline`, over the `history` store and its `store_migrations`), added to the tables (`submit`),
and summed up across platforms (`portability`). The nightly job and the CLI build on it."""
