"""Write chat prompts of many kinds over SmolLM2's own vocabulary as a prompts JSONL file, deterministically.

python recipes/smollm2_drafter/varied_prompts.py OUT.jsonl [COUNT] [SEED] [--overwrite]

`make_prompts.py`'s few templates over ~50 topics gave a drafter that accepts 2.2-2.5 tokens a round on held-out
prompts of those templates and ~1.45 on hand-written chat (docs/benchmarks.md, SmolLM2 round 16): it learned the
templates. These prompts draw their subject from the ~15,000 lowercase whole words of the model's tokenizer and
their form from a dozen kinds of request (explanations, definitions, comparisons, lists, how-to questions, letters
and notes, stories and poems, code in several languages, word problems with random numbers, advice), so that few
prompts share more than their form. The hand-written held-out prompts (`heldout_prompts.jsonl`) are never written.
An OUT.jsonl that already holds exactly these prompts is left as it is (a rerun resumes); one holding anything else
is refused unless --overwrite. The file is written through a rename.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

MIN_WORD = 6  # letters of the shortest subject word (shorter ones are mostly fragments and function words)

EXPLAIN = [
    "Explain {w} in simple terms.",
    "What is {w}? Answer in a few sentences.",
    'What does the word "{w}" mean? Use it in a sentence.',
    "Give me three interesting facts about {w}.",
    "Why do people care about {w}?",
    "How would you explain {w} to a ten-year-old?",
    "What is a common misunderstanding about {w}?",
    "Write a short paragraph about {w}.",
    "Summarize what you know about {w} in one paragraph.",
    "What are the advantages and disadvantages of {w}?",
]
COMPARE = [
    "What is the difference between {w} and {v}?",
    "Compare {w} with {v} in a short table.",
    "How are {w} and {v} related?",
]
LISTS = [
    "List five words related to {w}.",
    "Give me a numbered list of ideas involving {w}.",
    "Name three questions a student might ask about {w}, and answer them.",
]
HOW_TO = [
    "How do I get better at {skill}?",
    "Give me three tips for {skill}.",
    "What mistakes do beginners make when {skill}?",
    "Make a one-week plan for {skill}.",
]
SKILLS = [
    "cooking rice",
    "public speaking",
    "learning to swim",
    "writing essays",
    "saving money",
    "playing chess",
    "learning guitar",
    "gardening",
    "drawing faces",
    "running long distances",
    "studying for exams",
    "taking photos",
    "keeping a journal",
    "learning Spanish",
    "baking bread",
    "budgeting for a trip",
    "meditating",
    "typing faster",
    "organizing a small office",
    "training a puppy",
    "painting a room",
    "reading more books",
    "negotiating a salary",
    "making new friends",
    "cycling in a city",
    "memorizing vocabulary",
    "fixing a flat tire",
    "cleaning a kitchen",
]
WRITING = [
    "Write a short {kind} to {whom} about {w}.",
    "Draft a polite {kind} to {whom} asking for help with {w}.",
    "Write a {kind} to {whom} that mentions {w}.",
]
KINDS = ["email", "letter", "note", "text message", "invitation", "apology"]
WHOM = ["my neighbor", "a teacher", "my manager", "an old friend", "a customer", "my landlord", "a colleague"]
CREATIVE = [
    "Write a short story about {w}.",
    "Write a four-line poem about {w}.",
    "Write a haiku about {w}.",
    "Invent a character who loves {w} and describe them.",
    "Write a funny dialogue between two people about {w}.",
    "Suggest three names for a shop that sells {w}.",
]
LANGS = ["Python", "Python", "JavaScript", "Java", "C", "C++", "Go", "Rust", "Bash", "SQL"]
CODE_VERBS = [
    "counts",
    "sorts",
    "reverses",
    "filters",
    "groups",
    "finds the longest",
    "removes duplicate",
    "sums",
    "finds the smallest",
    "validates",
    "parses",
    "formats",
    "merges",
    "splits",
    "searches for",
]
CODE_OBJECTS = [
    "words in a sentence",
    "numbers in a list",
    "lines of a file",
    "characters of a string",
    "records by their date",
    "keys of a dictionary",
    "rows of a table",
    "email addresses",
    "dates in a log",
    "elements of two arrays",
    "vowels in a text",
    "prices in a receipt",
]
CODE = [
    "Write a {lang} function that {verb} {obj}.",
    "In {lang}, how do I write code that {verb} {obj}?",
    "Write a short {lang} program that {verb} {obj}, with comments.",
    "Explain, with a small {lang} example, how to handle errors when a program {verb} {obj}.",
]
CONCEPTS = [
    "recursion",
    "a stack",
    "a queue",
    "hashing",
    "sorting",
    "caching",
    "a database index",
    "threads",
    "memory leaks",
    "regular expressions",
    "version control",
    "unit testing",
    "an interface",
    "a closure",
    "binary search",
    "dynamic programming",
    "a graph",
    "a tree",
    "pointers",
    "an event loop",
]
CONCEPT_FORMS = ["Explain {c} with a short example in {lang}.", "When should I use {c}? Show it in {lang}."]
THINGS = ["apples", "books", "tickets", "marbles", "pencils", "cookies", "stamps", "chairs", "bottles", "coins"]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena"]


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 250), rng.randint(2, 60), rng.randint(2, 15)
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    forms = [
        f"{name} has {a} {thing} and buys {b} more, then gives {c} away. How many {thing} are left?",
        f"What is {a} multiplied by {b}? Show the steps.",
        f"A box holds {c} {thing}. How many boxes are needed for {a * c + b % c} {thing}?",
        f"What is {b} percent of {a * 4}?",
        f"If {c} workers need {b} hours for a job, how long would {c * 2} workers need?",
        f"Solve {c}x - {b} = {c * a - b} for x.",
        f"A car uses {c} liters of fuel per 100 km. How much fuel does a {a * 10} km trip need?",
        f"{name} reads {b} pages a day. How many days to finish a book of {a * 3} pages?",
        f"Convert {a} minutes to hours and minutes.",
        f"What is the average of {a}, {b} and {c}?",
    ]
    return rng.choice(forms)


def _prompt(rng: random.Random, words: list[str]) -> str:
    w, v = rng.choice(words), rng.choice(words)
    kinds: list[tuple[float, Callable[[], str]]] = [
        (0.22, lambda: rng.choice(EXPLAIN).format(w=w)),
        (0.05, lambda: rng.choice(COMPARE).format(w=w, v=v)),
        (0.05, lambda: rng.choice(LISTS).format(w=w)),
        (0.10, lambda: rng.choice(HOW_TO).format(skill=rng.choice(SKILLS))),
        (0.08, lambda: rng.choice(WRITING).format(kind=rng.choice(KINDS), whom=rng.choice(WHOM), w=w)),
        (0.12, lambda: rng.choice(CREATIVE).format(w=w)),
        (
            0.18,
            lambda: rng.choice(CODE).format(
                lang=rng.choice(LANGS), verb=rng.choice(CODE_VERBS), obj=rng.choice(CODE_OBJECTS)
            ),
        ),
        (0.05, lambda: rng.choice(CONCEPT_FORMS).format(c=rng.choice(CONCEPTS), lang=rng.choice(LANGS[:8]))),
        (0.15, lambda: _math(rng)),
    ]
    pick, total = rng.random(), 0.0
    for weight, make in kinds:
        total += weight
        if pick < total:
            return make()
    return kinds[-1][1]()


def vocabulary_words(vocab: list[str]) -> list[str]:
    """The tokenizer's lowercase whole words of at least MIN_WORD letters (GPT-2 style tokens: a leading "Ġ" marks
    a word start), sorted."""
    return sorted(
        {t[1:] for t in vocab if t.startswith("Ġ") and t[1:].isalpha() and t[1:].islower() and len(t) > MIN_WORD}
    )


def varied_prompts(count: int, seed: int, words: list[str], exclude: set[str]) -> list[str]:
    """`count` distinct prompts (see the module docstring), none in `exclude`."""
    if not words:
        raise ValueError("varied_prompts: no subject words (the tokenizer has no whole lowercase words?)")
    rng = random.Random(seed)
    seen: set[str] = set(exclude)
    out: list[str] = []
    while len(out) < count:
        text = _prompt(rng, words)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def main(argv: list[str] | None = None) -> None:
    from make_prompts import checked_output, prompt_file_arguments, write_prompts

    from fastrl.models.named import named_model_dir
    from fastrl.models.tokenizer import load_tokenizer

    parser = prompt_file_arguments("python recipes/smollm2_drafter/varied_prompts.py", __doc__.splitlines()[0], 1000)
    args = parser.parse_args(argv)
    target = checked_output(parser, args.out)
    heldout = Path(__file__).with_name("heldout_prompts.jsonl").read_text().splitlines()
    exclude = {json.loads(line)["prompt"] for line in heldout if line.strip()}
    words = vocabulary_words(list(load_tokenizer(named_model_dir("smollm2")).get_vocab()))
    prompts = varied_prompts(args.count, args.seed, words, exclude)
    if write_prompts(parser, target, args.out, prompts, args.overwrite):
        print(f"{args.count} prompts over {len(words)} words written to {args.out}")


if __name__ == "__main__":
    main()
