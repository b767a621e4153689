"""The task families, one file each (`spectra.kv.tasks.family` says what a file declares); `registry.TASKS` imports them
all when it is first listed."""
