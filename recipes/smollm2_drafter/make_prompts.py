"""Write varied chat prompts (math, coding, general questions) as a prompts JSONL file, deterministically.

python recipes/smollm2_drafter/make_prompts.py OUT.jsonl [COUNT] [SEED] [--overwrite]

An OUT.jsonl that already holds exactly these prompts is left as it is (a rerun of run.sh or run_long.sh resumes);
one holding anything else is refused unless --overwrite. The file is written through a rename.
"""

from __future__ import annotations

import argparse
import json
import random

from fastrl.atomic_files import write_atomic
from fastrl.bench.cli_args import at_least
from fastrl.commands.output_guard import check_output

TOPICS = [
    "photosynthesis",
    "the water cycle",
    "black holes",
    "inflation",
    "vaccines",
    "the French Revolution",
    "plate tectonics",
    "machine learning",
    "the immune system",
    "climate change",
    "the internet",
    "democracy",
    "earthquakes",
    "the moon's phases",
    "electric cars",
    "coffee",
    "sleep",
    "recycling",
    "volcanoes",
    "DNA",
    "the stock market",
    "rainbows",
    "gravity",
    "bees",
    "the Roman Empire",
    "solar panels",
    "music theory",
]
GENERAL = [
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Why does {t} matter?",
    "Give me a short summary of {t}.",
    "How would you explain {t} to a child?",
    "What is a common misconception about {t}?",
    "Write a short paragraph about {t}.",
    "List the pros and cons of {t}.",
]
ADVICE = [
    "How can I sleep better?",
    "Give me tips for learning a new language.",
    "How do I write a good email to my boss?",
    "What should I pack for a weekend hiking trip?",
    "How can I stay focused while studying?",
    "Suggest a healthy breakfast.",
    "How do I start running as a beginner?",
    "What are good habits for saving money?",
    "Write a haiku about autumn.",
    "Write a short poem about the sea.",
    "Tell me a short story about a robot.",
    "Suggest a name for a bakery.",
    "What is the capital of Australia?",
    "Who wrote Romeo and Juliet?",
]
CODE_TASKS = [
    "reverses a string",
    "checks whether a number is prime",
    "computes the factorial of n",
    "returns the n-th Fibonacci number",
    "counts the vowels in a string",
    "merges two sorted lists",
    "removes duplicates from a list",
    "finds the largest element of a list",
    "checks whether a word is a palindrome",
    "sorts a list of dictionaries by a key",
    "reads a text file and counts its words",
    "converts Celsius to Fahrenheit",
    "computes the average of a list of numbers",
    "flattens a nested list",
    "returns the GCD of two integers",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C", "Rust"]
CODE = [
    "Write a {lang} function that {task}.",
    "How would I write code in {lang} that {task}?",
    "Write a short {lang} program that {task}, with a comment on each step.",
]
CONCEPTS = [
    "a hash map",
    "recursion",
    "a linked list",
    "binary search",
    "big-O notation",
    "a closure",
    "an API",
    "git rebase",
    "a race condition",
    "unit tests",
]


def math_prompt(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
    forms = [
        f"What is {a} times {b}?",
        f"What is {a * 7} divided by 7?",
        f"Solve for x: {c}x + {a} = {c * b + a}.",
        f"A shop sells pens for {c} dollars each. How much do {a} pens cost?",
        f"If a train travels at {a} km per hour for {c} hours, how far does it go?",
        f"What is {c} percent of {a * 10}?",
        f"Is {a * b + 1} a prime number? Explain.",
        f"Tom has {a} apples and gives away {min(a - 1, c)}. How many are left?",
        f"What is the area of a rectangle with sides {a} and {b}?",
        f"Compute {a} + {b} - {c} step by step.",
    ]
    return rng.choice(forms)


def make_prompts(count: int, seed: int) -> list[str]:
    """`count` distinct prompts, about a third each math, coding, general."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        kind = rng.random()
        if kind < 0.34:
            text = math_prompt(rng)
        elif kind < 0.67:
            if rng.random() < 0.8:
                text = rng.choice(CODE).format(lang=rng.choice(LANGUAGES), task=rng.choice(CODE_TASKS))
            else:
                text = f"Explain {rng.choice(CONCEPTS)} with a small example."
        else:
            text = rng.choice(ADVICE) if rng.random() < 0.3 else rng.choice(GENERAL).format(t=rng.choice(TOPICS))
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def prompt_file_arguments(prog: str, description: str, default_count: int) -> argparse.ArgumentParser:
    """The command line of a prompts-file writer: OUT, [COUNT], [SEED], --overwrite."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("out", help="the prompts JSONL file to write")
    parser.add_argument(
        "count", nargs="?", type=at_least(1), default=default_count, help=f"how many prompts (default {default_count})"
    )
    parser.add_argument("seed", nargs="?", type=at_least(0), default=0, help="random seed (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace an OUT file holding other prompts")
    return parser


def checked_output(parser: argparse.ArgumentParser, out: str):
    """OUT checked before any work (a directory, a missing parent: one usage error)."""
    try:
        return check_output("OUT", out, {})
    except ValueError as err:
        parser.error(str(err).replace("OUT=", "OUT ", 1))


def write_prompts(parser: argparse.ArgumentParser, target, out: str, prompts: list[str], overwrite: bool) -> bool:
    """Write `prompts` to the checked OUT through a rename; an OUT already holding exactly them is left as it is (a
    rerun resumes: False), one holding anything else is one usage error unless `overwrite`."""
    text = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
    if target.exists:
        if target.path.read_bytes() == text.encode("utf-8"):
            print(f"{out} already holds these {len(prompts)} prompts")
            return False
        if not overwrite:
            parser.error(f"OUT {out} exists and holds other prompts; choose a new file, or pass --overwrite")
    write_atomic(target.path, text)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = prompt_file_arguments("python recipes/smollm2_drafter/make_prompts.py", __doc__.splitlines()[0], 320)
    args = parser.parse_args(argv)
    target = checked_output(parser, args.out)
    if write_prompts(parser, target, args.out, make_prompts(args.count, args.seed), args.overwrite):
        print(f"{args.count} prompts written to {args.out}")


if __name__ == "__main__":
    main()
