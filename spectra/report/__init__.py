"""Reporting: turn finished runs into what people read — summary numbers, the nonuniform k plan, terminal
tables and figures.

Everything here reads run objects or run directories, never models, so it needs neither torch nor a GPU (the
method registry is imported, lazily, only for its colours and headers). One module per analysis is its read side —
`analyze.py`, `approx.py`, `theorems.py`, `scaling.py`, `heads.py`, `cache.py`: its run object, `load(path, meta)`,
`show(run)` (what `spectra <kind> RUN` prints) and `plot(run, out)` with its figures — and what they share sits
below them, dependencies pointing one way:

- `summaries`: the numbers shown both in the terminal and in figures (pure numpy/pandas);
- `plan`: the nonuniform projected dimension (the k plan), built on a run's curves;
- `console`: the progress bar, tables and the terminal's one voice;
- `plots`: what every figure shares (`plots.style`) and the paper's Figure 1, drawn from several analyze runs.
"""
