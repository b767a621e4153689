"""fwe: the answers are the three most frequent coded words after the dots, counted here."""

from __future__ import annotations

from collections import Counter

from spectra.registry import TASKS


def test_fwe_answers_are_the_three_most_frequent_coded_words(build) -> None:
    example = build("fwe", 2000, length=2048)
    coded = example.context.split("Find the three most frequently appeared coded words. ", 1)[1].split()
    counts = Counter(word for word in coded if word != "...")
    ranked = [word for word, _ in counts.most_common()]
    assert set(example.answers) == set(ranked[:3]) and counts[ranked[2]] > counts[ranked[3]]
    assert Counter(coded)["..."] > counts[ranked[0]]
    coded = build("fwe", 3000, length=2048).context.split("coded words. ", 1)[1].split()
    assert len(set(coded)) == (2048 - 50) // 50  # every word of the vocabulary, (length − max_new_tokens) / 50
    assert TASKS["fwe"].max_new_tokens == 50 and example.asked[0].text.startswith("Question: Do not provide")
