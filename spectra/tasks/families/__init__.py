"""The task families, one file each (`spectra.tasks.family` says what a file declares); `registry.TASKS` imports them
all when it is first listed."""
