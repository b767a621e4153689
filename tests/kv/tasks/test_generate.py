"""Task files fitted to lengths: every example's tokens counted here from the chat template rendered independently,
answers in their contexts, depths spread evenly, seeded draws independent of the other tasks asked for; the essay
tasks' haystack (prose by default, several files, noise when asked) named in every record."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tiny

from spectra.errors import SpectraError
from spectra.kv.tasks.family import GeneratedExample, generated
from spectra.kv.tasks import haystack as haystack_module
from spectra.kv.tasks.generate import (
    MOST_REPEATS,
    Fitted,
    check_answers,
    check_haystack,
    check_repeats,
    choose_haystack,
    depths,
    generate,
    haystack_note,
    parse_lengths,
    parse_tasks,
    write_records,
)
from spectra.kv.tasks.haystack import NOISE, Haystack
from spectra.kv.tasks.question import numbered
from spectra.kv.tasks.records import TaskRecord, read_records
from spectra.registry import TASKS as REGISTRY

TASKS = generated()

LENGTHS = (2048, 3072)


def count(tokenizer, record) -> int:
    """The example's tokens: the rendered chat template cut after the context, the rest with the (longest) question
    and answer prefix, each tokenized alone (kvpress's pipeline), plus the tokens to generate."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": record.context}],
                                             add_generation_prompt=True, tokenize=False)
    cut = rendered.index(record.context) + len(record.context)
    first = tokenizer(rendered[:cut], add_special_tokens=False)["input_ids"]
    second = max(len(tokenizer(asked.text + rendered[cut:] + record.answer_prefix, add_special_tokens=False)[
        "input_ids"]) for asked in record.asked)  # a many-question record: its longest question fits
    return len(first) + second + record.max_new_tokens


#: a needle sentence of the niah tasks
NEEDLE = re.compile(r"One of the special magic (?:numbers|uuids) for [^ ]+ is: [0-9a-f-]+\.")


@pytest.fixture(scope="module")
def prose(tmp_path_factory) -> Haystack:
    """Real prose for the essay tasks: the licence texts (this project's README where they are absent)."""
    path = tmp_path_factory.mktemp("prose") / "prose.txt"
    path.write_text(tiny.licence_text(200_000))
    return Haystack.from_file(path)


@pytest.fixture(scope="module")
def fitted(chat_tokenizer, prose):
    return generate(chat_tokenizer, TASKS, LENGTHS, 3, seed=0, haystack=prose)


def test_every_example_fits_its_length_tightly(fitted, chat_tokenizer) -> None:
    assert [item.record.example for item in fitted] == list(range(len(TASKS) * len(LENGTHS) * 3))
    for item in fitted:
        record = item.record
        tokens = count(chat_tokenizer, record)
        assert tokens == item.tokens <= record.length, record.task
        assert record.length - tokens < 0.1 * record.length, (record.task, record.length, tokens)
        assert all(answer in record.context for answer in record.answers)


def test_records_come_in_task_then_length_order_with_depths_spread(fitted) -> None:
    order = [(item.record.task, item.record.length) for item in fitted]
    assert order == [(task, length) for task in TASKS for length in LENGTHS for _ in range(3)]
    for item in fitted:  # the tasks with a needle spread its depths; vt, cwe and fwe have none
        if item.record.task.startswith("niah") or item.record.task == "passkey":
            assert item.record.depth in (0.0, 0.5, 1.0)
        elif item.record.task in ("vt", "cwe", "fwe"):
            assert item.record.depth is None
    assert depths(1) == [0.5] and depths(5) == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_each_record_names_the_haystack_its_needles_hide_in(fitted, prose) -> None:
    """The essay tasks hide their needles in the prose, whose first `size` words are the context once the needles
    are taken out (and no noise sentence); the noise tasks in RULER's noise; each record names its haystack and the
    sha256 of its text ("needle" for the distractor-needle tasks, nothing for a task with no haystack)."""
    noise = Haystack.noise()
    named = {"essay": (prose.name, prose.sha256), "noise": ("noise", noise.sha256), "needle": ("needle", None),
             None: (None, None)}
    kinds = set()
    for item in fitted:
        record = item.record
        kind = REGISTRY[record.task].haystack_type(record.task)
        kinds.add(kind)
        assert (record.haystack, record.haystack_sha256) == named[kind], record.task
        if kind == "essay":
            body = record.context.split("\n", 1)[1]  # after the instruction line
            assert NEEDLE.sub(" ", body).split() == list(prose.words[: item.size]) and NOISE not in record.context
        elif kind == "noise":
            assert NOISE in record.context
    assert kinds == {"essay", "noise", "needle", None}


def test_the_essay_tasks_read_the_licence_texts_by_default(tmp_path: Path, monkeypatch) -> None:
    """No --haystack: the essay tasks read the licence texts (the folder's plain files, sorted); tasks that read no
    haystack get RULER's noise; `noise` asks for the noise; several files are read in order, comma-separated or as a
    list; where the licence texts are absent the default is refused in one line (never silently noise)."""
    folder = tmp_path / "common-licenses"
    folder.mkdir()
    (folder / "GPL-3").write_text("The GNU General Public License is a free, copyleft license.")
    (folder / "Apache-2.0").write_text("Licensed under the Apache License.")
    (folder / "GPL").symlink_to(folder / "GPL-3")
    monkeypatch.setattr(haystack_module, "LICENCES", folder)
    chosen = choose_haystack(None, ("niah_single_1", "niah_single_2"))
    assert chosen.name == str(folder) and chosen.words[:4] == ("Licensed", "under", "the", "Apache")
    assert len(chosen.words) == 5 + 10
    assert choose_haystack(None, ("passkey", "niah_single_1")) == Haystack.noise()
    assert choose_haystack("noise", ("niah_single_2",)) == Haystack.noise()
    first, second = folder / "GPL-3", folder / "Apache-2.0"
    several = choose_haystack(f"{first},{second}", ("niah_multikey_1",))
    assert several == choose_haystack([str(first), second], ("niah_multikey_1",))
    assert several.words[0] == "The" and several.words[-1] == "License." and several.name == f"{first},{second}"
    for given, message in ((f"noise,{first}", "noise is RULER's noise haystack and takes no files beside it"),
                           ("", "names no file"), (f"{first},,{second}", "has an empty item")):
        with pytest.raises(SpectraError, match=re.escape(message)):
            choose_haystack(given, ("niah_single_2",))
    monkeypatch.setattr(haystack_module, "LICENCES", tmp_path / "absent")
    assert choose_haystack(None, ("passkey",)) == Haystack.noise()  # no task reads it: nothing is missing
    with pytest.raises(SpectraError) as refused:
        choose_haystack(None, ("passkey", "niah_single_2", "niah_single_3"))
    assert refused.value.for_cli() == (
        f"niah_single_2/3 hide their needles in prose: by default the licence texts Debian systems ship "
        f"({tmp_path / 'absent'}), which this machine lacks; pass --haystack FILE (any local text, several "
        "comma-separated) or --haystack noise (RULER's noise sentence repeated)")


def test_a_haystack_repeated_absurdly_often_is_refused() -> None:
    """A text short enough to repeat more than MOST_REPEATS times is a paragraph repeated, as the noise is: refused
    in one line saying how often it would repeat; up to MOST_REPEATS it is only noted (as RULER repeats its
    essays)."""
    def fitted(task: str, size: int) -> Fitted:
        return Fitted(TaskRecord("c", numbered(["q"], [["a"]]), "p", 8, task, 1024, 0.5, 0), size, 1000)

    short = Haystack(("one", "two", "three"), "short.txt")
    check_repeats([fitted("niah_single_2", 3 * MOST_REPEATS), fitted("passkey", 10_000)], short)
    check_repeats([fitted("niah_single_2", 10_000)], Haystack.noise())
    with pytest.raises(SpectraError) as refused:
        check_repeats([fitted("niah_single_2", 3 * MOST_REPEATS), fitted("niah_multikey_1", 3 * MOST_REPEATS + 1)],
                      short)
    assert refused.value.for_cli() == (
        "the haystack short.txt holds 3 words: the contexts of niah_single_2, niah_multikey_1 would repeat it 11 "
        "times, a paragraph repeated as RULER's noise is (at most 10 repeats are taken); give a longer text or "
        "several files (--haystack a.txt,b.txt), or --haystack noise")


def test_written_records_read_back(fitted, tmp_path: Path) -> None:
    path = write_records(tmp_path / "sub" / "tasks.jsonl", [item.record for item in fitted])
    assert read_records(path) == [item.record for item in fitted]


def test_draws_depend_on_the_seed_not_on_the_other_tasks(chat_tokenizer, fitted) -> None:
    alone = generate(chat_tokenizer, ["passkey"], [2048], 3, seed=0)
    together = [item for item in fitted if item.record.task == "passkey" and item.record.length == 2048]
    assert [(a.record.context, a.record.answers) for a in alone] == [
        (t.record.context, t.record.answers) for t in together]
    other = generate(chat_tokenizer, ["passkey"], [2048], 3, seed=1)
    assert [a.record.answers for a in alone] != [o.record.answers for o in other]


def test_without_a_chat_template(tokenizer) -> None:
    for item in generate(tokenizer, ["niah_single_1", "vt"], [2048], 2, seed=0):
        record = item.record
        tokens = (len(tokenizer("<s>" + record.context, add_special_tokens=False)["input_ids"])
                  + len(tokenizer(record.asked[0].text + "\n" + record.answer_prefix,
                                  add_special_tokens=False)["input_ids"])
                  + record.max_new_tokens)
        assert tokens == item.tokens <= 2048 and tokens > 1800


def test_a_length_too_short_for_the_template_is_refused(tokenizer) -> None:
    with pytest.raises(SpectraError, match="--length 200 is too short for niah_single_1|lengths 200 is too short"):
        generate(tokenizer, ["niah_single_1"], [200], 1)


def test_task_names_and_lengths() -> None:
    assert parse_tasks("vt, cwe,vt") == ("vt", "cwe") and parse_tasks("all") == TASKS
    assert parse_lengths("2048,1024") == (2048, 1024) and parse_lengths([512]) == (512,)
    with pytest.raises(SpectraError, match="unknown task qa_1 in --tasks|unknown task qa_1 in tasks"):
        parse_tasks("vt,qa_1")
    for bad in ("", "1k", "0,5"):
        with pytest.raises(SpectraError, match="token counts"):
            parse_lengths(bad)


def test_cwe_beyond_its_word_lists_is_refused(tokenizer, monkeypatch) -> None:
    import spectra.kv.tasks.families.cwe as cwe

    monkeypatch.setattr(cwe, "common_words", lambda: ("one", "two") * 30)
    with pytest.raises(SpectraError, match="cwe at length 2048: cwe needs .* distinct words"):
        generate(tokenizer, ["cwe"], [2048], 1)


def test_an_answer_missing_from_its_context_is_refused() -> None:
    """An example whose context lacks one of its answers could not be solved: generation refuses it in one line
    naming the task, length, sample and answer; one whose answers all stand in it passes."""
    kept = GeneratedExample("the pass key is 4821. remember it.", numbered(["What is the pass key?"], [["4821"]]),
                            "The pass key is", 0.5)
    check_answers(kept, "passkey", 1024, 0)
    lost = GeneratedExample("the pass key is 4821.", numbered(["What are the keys?"], [["4821", "7730"]]), "They are",
                            0.5)
    with pytest.raises(SpectraError, match="^niah_multikey_1 at length 2048, sample 3: the answer '7730' is not in its"):
        check_answers(lost, "niah_multikey_1", 2048, 3)


def test_a_haystack_no_task_reads_is_refused() -> None:
    """The README's own command gave --haystack to passkey and niah_single_1, which hide their needles in noise:
    the file changed nothing. It is refused, naming the tasks that read one."""
    check_haystack(("passkey", "niah_single_2"), True)
    check_haystack(("passkey",), False)
    with pytest.raises(SpectraError) as refused:
        check_haystack(("passkey", "vt"), True)
    assert refused.value.for_cli().startswith(
        "--haystack is read only by niah_single_2/3, niah_multikey_1, niah_multivalue, niah_multiquery, "
        "niah_multiquery_questions, and none of the tasks asked for (passkey, vt) is one of them: drop --haystack")


def test_a_repeated_haystack_is_noted() -> None:
    def fitted(task: str, size: int) -> Fitted:
        return Fitted(TaskRecord("c", numbered(["q"], [["a"]]), "p", 8, task, 1024, 0.5, 0), size, 1000)

    short = Haystack(("one", "two", "three"), "short.txt")
    assert haystack_note([fitted("niah_single_2", 3), fitted("passkey", 900)], short) is None
    assert haystack_note([fitted("niah_single_2", 3)], Haystack.noise()) is None
    note = haystack_note([fitted("niah_single_2", 10), fitted("niah_multivalue", 700), fitted("niah_single_2", 4)],
                         short)
    assert note == ("the haystack short.txt holds 3 words: the contexts of niah_single_2, niah_multivalue repeat it "
                    "up to 234 times (a text longer than the contexts repeats nothing)")
