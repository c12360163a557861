"""The arithmetic-chain task: heavy-tailed lengths, valid varied solutions, a strict reward, config checks."""

import random
import statistics

import pytest

from fastrl.rl.tasks import ArithChainTask, Problem, TaskConfig
from fastrl.rl.tasks.power_law import TruncatedPowerLaw


def quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_response_lengths_are_long_tailed_and_fit_the_context():
    task = ArithChainTask()
    rng = random.Random(0)
    problems = task.sample_batch(4000, rng)
    lengths = [len(task.solution_text(p, rng)) + 1 for p in problems]  # character tokens + <eos>
    assert quantile(lengths, 0.99) / quantile(lengths, 0.5) >= 5
    assert max(lengths) <= task.max_response_chars() + 1
    assert max(len(p.prompt) for p in problems) <= task.max_prompt_chars()
    assert task.max_prompt_chars() + task.max_response_chars() + 2 <= task.config.context_length
    by_size: dict[int, list[int]] = {}
    for problem, length in zip(problems, lengths, strict=True):
        by_size.setdefault(problem.size, []).append(length)
    means = [statistics.mean(by_size[n]) for n in sorted(by_size) if len(by_size[n]) >= 20]
    assert means == sorted(means)  # longer problems, longer responses


def test_power_law_matches_its_probabilities():
    law = TruncatedPowerLaw(2, 40, 1.8)
    assert sum(law.probability(n) for n in range(2, 41)) == pytest.approx(1.0)
    assert law.probability(1) == 0.0 and law.probability(41) == 0.0
    rng = random.Random(1)
    draws = [law.sample(rng) for _ in range(20000)]
    assert min(draws) >= 2 and max(draws) <= 40
    assert draws.count(2) / len(draws) == pytest.approx(law.probability(2), abs=0.015)


def test_every_solution_is_correct_and_solutions_vary():
    task = ArithChainTask()
    rng = random.Random(2)
    for problem in task.sample_batch(500, rng):
        text = task.solution_text(problem, rng)
        assert task.reward(problem, text) == 1.0, text
        assert "<" not in text
    problem = task.make_problem([23, 5, 81, 4, 17, 9])
    assert task.solution_text(problem, random.Random(7)) == task.solution_text(problem, random.Random(7))
    variants = {task.solution_text(problem, random.Random(seed)) for seed in range(50)}
    assert len(variants) >= 10
    assert all(task.reward(problem, v) == 1.0 for v in variants)


def test_solution_steps_are_a_valid_running_sum_over_named_terms():
    task = ArithChainTask(TaskConfig(p_check=0.0))
    problem = task.make_problem([23, 5, 81, 4])
    values = dict(item.split("=") for item in problem.prompt.split()[1:-1])
    assert values == {"a": "23", "b": "5", "c": "81", "d": "4"}
    for seed in range(20):
        text = task.solution_text(problem, random.Random(seed))
        steps = [s.strip(" ,;") for s in text.split() if "+" in s]
        names, total = [], None
        for step in steps:
            name, addition, result = step.split("=")
            a, b = (int(x) for x in addition.split("+"))
            assert a + b == int(result)
            if total is None:
                first, second = name.split("+")
                assert (values[first], values[second]) == (str(a), str(b))
                names += [first, second]
            else:
                assert name.startswith("+") and values[name[1:]] == str(b) and a == total
                names.append(name[1:])
            total = int(result)
        assert sorted(names) == ["a", "b", "c", "d"]


def test_wrong_or_malformed_answers_get_zero():
    task = ArithChainTask()
    problem = task.make_problem([23, 5, 81, 4])
    good = task.solution_text(problem, random.Random(4))
    assert task.reward(problem, good) == 1.0
    assert task.reward(problem, " 23+5=28 28+81=109 109+4=113 so answer 113  ") == 1.0
    for bad in [
        good.replace("answer 113", "answer 114"),
        good + " 7",
        good.replace("answer 113", "answer 0113"),
        good.replace("answer 113", "answer113"),
        good.replace("answer 113", "answer -113"),
        "answer 113 is wrong",
        "",
        "<eos><pad>\x00\n",
        "answer " + "9" * 5000,
        "so answer 113.0",
    ]:
        assert task.reward(problem, bad) == 0.0, bad
    assert task.reward(problem, None) == 0.0  # type: ignore[arg-type]


def test_problem_and_buckets():
    task = ArithChainTask()
    problem = task.make_problem([23, 5, 81, 4])
    assert problem == Problem(prompt="sum a=23 b=5 c=81 d=4 =", answer=113, size=4, numbers=(23, 5, 81, 4))
    assert [task.bucket_of_size(n) for n in (2, 3, 4, 7, 8, 15, 16, 40)] == [
        "2-3",
        "2-3",
        "4-7",
        "4-7",
        "8-15",
        "8-15",
        "16+",
        "16+",
    ]
    assert task.bucket_names() == ["2-3", "4-7", "8-15", "16+"]
    assert task.size_bucket(problem) == "4-7"
    with pytest.raises(ValueError, match="answer"):
        Problem(prompt="sum 1 2 =", answer=4, size=2, numbers=(1, 2))
    batch = task.sample_batch(3, random.Random(5))
    assert batch == task.sample_batch(3, random.Random(5))


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"n_min": 1}, "n_min"),
        ({"n_max": 1}, "n_max"),
        ({"n_max": 53}, "n_max"),
        ({"size_exponent": -1.0}, "size_exponent"),
        ({"value_min": -1}, "value_min"),
        ({"value_max": 0}, "value_max"),
        ({"p_swap": 1.5}, "p_swap"),
        ({"p_check": -0.1}, "p_check"),
        ({"max_checks": -1}, "max_checks"),
        ({"bucket_edges": (2, 2, 8)}, "bucket_edges"),
        ({"context_length": 4}, "context_length"),
        ({"value_max": 10**17, "n_max": 10}, "value_max=100000000000000000 with n_max=10"),
    ],
)
def test_config_validation_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        TaskConfig(**kwargs)


def test_task_rejects_problems_that_do_not_fit_the_context():
    with pytest.raises(ValueError, match="n_max"):
        ArithChainTask(TaskConfig(n_max=40, context_length=512))
    with pytest.raises(ValueError, match="at most 52 terms"):
        ArithChainTask().make_problem(list(range(60)))


def test_the_largest_answer_a_config_allows_is_read_by_the_reward():
    """value_max=10**18 was taken, and the task's own solution then scored 0: the reward reads 18 digits."""
    largest = 10**18 // 2 - 1  # two terms: an answer of 18 digits, the longest the reward reads
    task = ArithChainTask(TaskConfig(n_min=2, n_max=2, value_min=largest, value_max=largest, context_length=400))
    problem = task.sample_problem(random.Random(0))
    assert len(str(problem.answer)) == 18
    assert task.reward(problem, task.solution_text(problem, random.Random(0))) == 1.0
