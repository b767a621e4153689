"""The Python API: one keyword function per registered analysis, built from its declarations.

`spectra.analyze(model, data, length=…, samples=…, …)` (and `approx`, `theorems`, `scaling`, …) takes the run
configuration's options and the analysis's own as keywords, exactly the names the command line spells with
dashes, plus `progress` (a callback (done, total)) and `notify` (where one-line notices go; default print). It
returns the finished run, loaded. The keyword signature, defaults and docstring are read from the declarations
(`spectra.options`), so an option added to an analysis appears here with nothing else to change.

The two commands that are not analyses have their functions here too, written out: `tasks` (`spectra tasks`) and
`artifacts` (`spectra artifacts`); each hands its keywords to its command as one request. Every registered report
page (`spectra.pages`) has its function too, `spectra.leaderboard(runs, out=…)` and the others (`page_function`: the
page's name with underscores, its options as keywords), which writes the page as its command does.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import modelcache
from .config import RunConfig
from .kinds import REGISTRY, Analysis, load_run
from .options import declared, split
from .pages import PAGES, Page
from .reporter import Progress, Reporter

if TYPE_CHECKING:
    from .kv.tasks.command import Written
    from .kv.tasks.generate import Fitted
    from .pages.written import Written as WrittenPage

#: the keywords every function takes beside the options: how the run talks
TALK = ("progress", "notify")


def run(analysis: Analysis, values: dict[str, Any], progress: Progress | None = None,
        notify: Callable[[str], None] = print):
    """Run `analysis` with keyword `values` (run configuration and options) and return the finished run."""
    config_values, option_values = split(values, RunConfig, analysis.options)
    config = RunConfig(**{**analysis.defaults, **config_values})
    options = analysis.options(**option_values)
    reporter = Reporter(progress, notify)
    with modelcache.using(config.model_cache, reporter):
        modelcache.prepare(config)  # a GGUF file whole and its cache writable, before any work
        return load_run(analysis.run(config, options, reporter))


def parameters(analysis: Analysis) -> list[inspect.Parameter]:
    """The function's parameters: model and data positional, then every option as a keyword, then `TALK`."""
    keyword, positional = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    found = []
    for option in declared(RunConfig):
        if option.name not in analysis.run_fields:
            continue
        default = analysis.defaults.get(option.name, option.default)
        if option.name == "model" and analysis.needs_model:
            found.append(inspect.Parameter("model", positional))
        else:
            found.append(inspect.Parameter(option.name, positional if option.name in ("model", "data") else keyword,
                                           default=default))
    found += [inspect.Parameter(option.name, keyword, default=option.default) for option in declared(analysis.options)]
    found += [inspect.Parameter("progress", keyword, default=None), inspect.Parameter("notify", keyword, default=print)]
    return found


def docstring(analysis: Analysis) -> str:
    """The analysis's summary, then one line per keyword with its help."""
    lines = [analysis.summary, "", "Keywords (the command line spells them with dashes):"]
    for cls in (RunConfig, analysis.options):
        for option in declared(cls):
            if cls is RunConfig and option.name not in analysis.run_fields:
                continue
            text = analysis.run_help.get(option.name, option.help) if cls is RunConfig else option.help
            lines.append(f"    {option.name}: {text}")
    lines += ["    progress: a callback progress(done, total) after every batch.",
              "    notify: where one-line notices go (default: print).",
              "", "Returns the finished run, loaded (as `spectra.load_run` reads it)."]
    return "\n".join(lines)


def facade(analysis: Analysis) -> Callable[..., Any]:
    """The keyword function of `analysis` (signature and docstring from its declarations)."""
    signature = inspect.Signature(parameters(analysis))

    def function(*args: Any, **kwargs: Any):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        talk = {name: values.pop(name) for name in TALK}
        return run(analysis, values, **talk)

    function.__name__ = function.__qualname__ = analysis.name
    function.__module__ = "spectra"
    function.__doc__ = docstring(analysis)
    function.__signature__ = signature  # type: ignore[attr-defined]
    return function


def tasks(model: str, *, tasks: str | Sequence[str] = "all", lengths: str | Sequence[int], samples: int = 10,
          out: str | Path, haystack: str | Path | Sequence[str | Path] | None = None, seed: int = 0,
          gguf_file: str | None = None, overwrite: bool = False,
          progress: Callable[[str, int, list[Fitted]], None] | None = None) -> Written:
    """Generate `samples` records per task and length for `model`'s tokenizer and write them to `out` (jsonl), as
    `spectra tasks` does: `tasks` and `lengths` comma-separated or sequences, the essay tasks reading `haystack`
    (text files or folders, "noise", or by default the licence texts Debian ships); an existing `out` is replaced
    only with `overwrite`. `progress(task, length, fitted)` after each task and length."""
    from .kv.tasks.command import TaskRequest, make_tasks

    return make_tasks(TaskRequest(model, tasks, lengths, samples, out, haystack, seed, gguf_file, overwrite), progress)


def artifacts(kind: str, model: str, *, data: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike,
              length: int = 1000, samples: int = 16, threads: int | None = None, gguf_file: str | None = None,
              overwrite: bool = False, surrogate: str = "mlp", model_cache: bool = True,
              progress: Callable[[int], None] | None = None, notify: Callable[[str], None] = print) -> Path:
    """Fit `kind`'s artifact (qfilter, expected_attention_stats, kvzap) for `model` on the text files `data`
    (`samples` blocks of `length` tokens) and write it to the directory `out` in kvpress's format, as
    `spectra artifacts` does; `surrogate`: kvzap's, linear or mlp. `data`: a path, several, or a comma-separated
    string of them (as `--data`); `model_cache`: a GGUF model through the model cache. `progress(blocks)` after each
    block; `notify`: where one-line notices go (fewer blocks than asked for, the model cache's). Returns the
    directory written."""
    from .inputs import items
    from .kv.artifactfit import ArtifactRequest, make_artifact

    listed = items(data, "--data") if isinstance(data, str) else [data] if isinstance(data, os.PathLike) else data
    request = ArtifactRequest(kind, model, tuple(Path(path) for path in listed), Path(out), length, samples, threads,
                              gguf_file, overwrite, surrogate)
    reporter = Reporter(notify=notify)
    with modelcache.using(model_cache, reporter):
        return make_artifact(request, progress, reporter)


def pages() -> dict[str, Page]:
    """The registered report pages by their function's name (`task_scores` for the page task-scores)."""
    return {page.function: page for page in PAGES.values()}


def page_function(page: Page) -> Callable[..., WrittenPage]:
    """The function of `page`: `(runs, *, out, **options)` writes the page of the finished runs (run directories or
    published folders) into the folder `out` as `spectra <page>` does, and returns the files written."""
    options = [inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default)
               for option in declared(page.options)]
    signature = inspect.Signature([inspect.Parameter("runs", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                   inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY), *options])

    def function(*args: Any, **kwargs: Any) -> WrittenPage:
        from .pages.written import write

        bound = signature.bind(*args, **kwargs)
        values = dict(bound.arguments)
        runs = values.pop("runs")
        return write(page, [runs] if isinstance(runs, (str, os.PathLike)) else runs, values.pop("out"), **values)

    function.__name__ = function.__qualname__ = page.function
    function.__module__ = "spectra"
    function.__doc__ = "\n".join([page.summary, "", f"Writes <out>/{page.name}.md, .png and .csv (as `spectra "
                                  f"{page.name} RUN... --out DIR`); returns the files written.", "",
                                  "Keywords:", "    out: the folder to write into (made if missing).",
                                  *(f"    {option.name}: {option.help}" for option in declared(page.options))])
    function.__signature__ = signature  # type: ignore[attr-defined]
    return function


def __getattr__(name: str) -> Callable[..., Any]:
    """`spectra.api.analyze` and the other analyses' functions, and the report pages' (`spectra.api.leaderboard`),
    made on first use."""
    if name in REGISTRY:
        return facade(REGISTRY[name])
    if name in pages():
        return page_function(pages()[name])
    raise AttributeError(f"module 'spectra.api' has no attribute {name!r}")
