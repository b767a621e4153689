"""The cache study's wing: what `spectra cache` (the NLL of text) and `spectra evaluate` (long-context tasks) are made
of — the exact prefill (`prefill`), the compressed cache and what a press keeps of it (`presses/`, `cell`), greedy
generation from it (`generation`), the continuation scored against it (`continuation`), the task families and task
files (`tasks/`), the axis map (`axes`) and head patterns (`headpattern`). The kinds and read sides that use them
stay with the other analyses (`kinds/`, `probes/`, `report/`)."""
