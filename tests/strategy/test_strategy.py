"""Strategy values: parsing, every validation rule, round trips, DISABLE, strategy spaces."""

import pytest

from fastrl.strategy.strategy import DISABLE, Strategy, max_tree_tokens, parse_strategy_space


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8_4_32", Strategy(8, 4, 32)),
        ("8_4_16", Strategy(8, 4, 16)),
        ("3_1_4", Strategy(3, 1, 4)),
        ("1_1_2", Strategy(1, 1, 2)),
        ("2_2_7", Strategy(2, 2, 7)),
        ("8_4_117", Strategy(8, 4, 117)),
    ],
)
def test_parse_valid(text, expected):
    strategy = Strategy.parse(text)
    assert strategy == expected
    assert (strategy.steps, strategy.topk, strategy.num_draft_tokens) == (
        expected.steps,
        expected.topk,
        expected.num_draft_tokens,
    )
    assert not strategy.is_disabled
    assert str(strategy) == text
    assert Strategy.parse(str(strategy)) == strategy


def test_disable():
    assert DISABLE.is_disabled
    assert str(DISABLE) == "disable"
    assert Strategy.parse("disable") == DISABLE
    assert Strategy.parse(" Disable ") == DISABLE
    assert Strategy.parse(str(DISABLE)) == DISABLE
    assert DISABLE.max_accept_length == 1
    assert Strategy(8, 4, 32).max_accept_length == 9


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("8_4", "exactly three underscore-separated integers"),
        ("8_4_32_1", "exactly three underscore-separated integers"),
        ("8-4-32", "exactly three underscore-separated integers"),
        ("a_b_c", "exactly three underscore-separated integers"),
        ("8_4_3.5", "exactly three underscore-separated integers"),
        ("", "exactly three underscore-separated integers"),
        ("enable", "exactly three underscore-separated integers"),
        ("0_4_32", "must all be >= 1"),
        ("8_0_32", "must all be >= 1"),
        ("8_-1_32", "must all be >= 1"),
        ("0_0_0", "must all be >= 1"),
        ("1_2_1", "num_draft_tokens must be >= 2"),
        ("2_2_8", "exceeds the tree capacity"),
        ("1_4_6", "exceeds the tree capacity"),
        ("8_4_118", "exceeds the tree capacity"),
        ("3_1_5", "topk=1 chain must have num_draft_tokens == steps + 1"),
        ("3_1_3", "topk=1 chain must have num_draft_tokens == steps + 1"),
    ],
)
def test_parse_errors_name_string_and_rule(text, rule):
    with pytest.raises(ValueError) as info:
        Strategy.parse(text)
    message = str(info.value)
    assert repr(text) in message
    assert rule in message


def test_non_string_rejected():
    with pytest.raises(ValueError, match="expected a string"):
        Strategy.parse(8.0)
    with pytest.raises(ValueError, match="expected a string"):
        Strategy.parse(None)


def test_an_integer_is_an_unquoted_strategy_and_the_error_says_to_quote_it():
    """YAML and Hydra (verl's `...custom.fastrl.strategy=3_1_4` override) read 3_1_4 as the integer 314."""
    for value in (314, 8432):
        with pytest.raises(ValueError, match=r"got the integer .*quote the strategy"):
            Strategy.parse(value)
    with pytest.raises(ValueError, match="expected a string") as info:
        Strategy.parse(True)
    assert "integer" not in str(info.value)


@pytest.mark.parametrize("fields", [(0, 4, 32), (8, 4, 1), (2, 2, 8), (3, 1, 5), (-1, 1, 0)])
def test_direct_construction_validates(fields):
    with pytest.raises(ValueError, match="_".join(str(f) for f in fields)):
        Strategy(*fields)


def test_direct_construction_rejects_non_ints():
    with pytest.raises(ValueError, match="must be an int"):
        Strategy(8.0, 4, 32)
    with pytest.raises(ValueError, match="must be an int"):
        Strategy(True, 1, 2)


def test_max_tree_tokens():
    assert max_tree_tokens(1, 1) == 2
    assert max_tree_tokens(7, 1) == 8
    assert max_tree_tokens(3, 2) == 1 + 2 + 2 * 4
    assert max_tree_tokens(8, 4) == 1 + 4 + 7 * 16
    with pytest.raises(ValueError):
        max_tree_tokens(0, 4)


def test_capacity_boundary_is_inclusive():
    for steps, topk in [(1, 3), (2, 2), (4, 3), (8, 4)]:
        capacity = max_tree_tokens(steps, topk)
        assert Strategy(steps, topk, capacity).num_draft_tokens == capacity
        with pytest.raises(ValueError, match="capacity"):
            Strategy(steps, topk, capacity + 1)


def test_value_semantics():
    assert Strategy.parse("8_4_32") == Strategy(8, 4, 32)
    assert hash(Strategy.parse("8_4_32")) == hash(Strategy(8, 4, 32))
    assert len({Strategy.parse("8_4_32"), Strategy(8, 4, 32), DISABLE}) == 2
    assert sorted([Strategy(8, 4, 32), DISABLE, Strategy(3, 1, 4), Strategy(8, 4, 16)]) == [
        DISABLE,
        Strategy(3, 1, 4),
        Strategy(8, 4, 16),
        Strategy(8, 4, 32),
    ]
    with pytest.raises(AttributeError):
        Strategy(8, 4, 32).steps = 2


def test_parse_strategy_space():
    space = parse_strategy_space(["8_4_32", "8_4_16", "8_4_8", "disable"])
    assert space == [Strategy(8, 4, 32), Strategy(8, 4, 16), Strategy(8, 4, 8), DISABLE]
    assert [str(s) for s in space] == ["8_4_32", "8_4_16", "8_4_8", "disable"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], "non-empty"),
        ("8_4_32", "non-empty list"),
        (["8_4_32", "8_4_32"], "duplicate strategy '8_4_32'"),
        (["disable", "8_4_8", "DISABLE"], "duplicate strategy 'disable'"),
        (["8_4_32", "8_4"], "'8_4'"),
    ],
)
def test_parse_strategy_space_errors(names, message):
    with pytest.raises(ValueError, match=message):
        parse_strategy_space(names)


# ---- history (suffix_N) and hybrid (S_K_N+suffix_M) strategies ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("suffix_2", Strategy(0, 0, 0, history_nodes=2)),
        ("suffix_16", Strategy(0, 0, 0, history_nodes=16)),
        ("8_4_32+suffix_16", Strategy(8, 4, 32, history_nodes=16)),
        ("3_1_4+suffix_32", Strategy(3, 1, 4, 32)),
    ],
)
def test_parse_history_and_hybrid(text, expected):
    strategy = Strategy.parse(text)
    assert strategy == expected
    assert str(strategy) == text
    assert Strategy.parse(f"  {text} ") == strategy
    assert not strategy.is_disabled
    assert strategy.is_history
    assert strategy.history_nodes == expected.history_nodes
    assert strategy.uses_drafter == (expected.steps > 0)
    assert strategy.is_hybrid == (expected.steps > 0)


def test_history_properties():
    history = Strategy.parse("suffix_16")
    assert (history.uses_drafter, history.is_history, history.is_hybrid) == (False, True, False)
    assert history.history_max_depth == 15
    assert history.max_accept_length == 16
    assert history.max_tree_nodes == 16
    hybrid = Strategy.parse("8_4_32+suffix_4")
    assert hybrid.max_accept_length == 9  # EAGLE's 8 steps are deeper than history's 3
    assert hybrid.max_tree_nodes == 32 + 4 - 1  # the two trees share the root
    eagle = Strategy.parse("8_4_32")
    assert (eagle.uses_drafter, eagle.is_history, eagle.history_nodes, eagle.max_tree_nodes) == (True, False, 0, 32)
    assert (DISABLE.uses_drafter, DISABLE.is_history, DISABLE.max_tree_nodes) == (False, False, 1)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("suffix_1025", "suffix_N takes N <= 1024"),
        ("3_1_4+suffix_5000", "suffix_N takes N <= 1024"),
        (
            "8_4_32+suffix_1000",
            "a hybrid tree holds N + M - 1 nodes (one root), at most 1024, got 32 + 1000 - 1 = 1031",
        ),
        ("suffix_+8", "the history part must be 'suffix_N' with N an integer"),
        ("100000_1_100001", "steps <= 64, topk <= 64 and num_draft_tokens <= 1024"),
        ("8_65_32", "steps <= 64, topk <= 64 and num_draft_tokens <= 1024"),
        ("12_8_1025", "steps <= 64, topk <= 64 and num_draft_tokens <= 1024"),
        ("suffix_0", "suffix_N needs N >= 2"),
        ("suffix_1", "suffix_N needs N >= 2"),
        ("suffix_-3", "suffix_N needs N >= 2"),
        ("suffix_x", "must be 'suffix_N' with N an integer"),
        ("suffix_", "must be 'suffix_N' with N an integer"),
        ("suffix_8_2", "must be 'suffix_N' with N an integer"),
        ("8_4_32+suffix_", "must be 'suffix_N' with N an integer"),
        ("8_4_32+suffix_1", "suffix_N needs N >= 2"),
        ("suffix_8+suffix_8", "one EAGLE part then one history part"),
        ("suffix_8+8_4_32", "one EAGLE part then one history part"),
        ("8_4_32+8_4_16", "one EAGLE part then one history part"),
        ("8_4_32+suffix_8+suffix_8", "one EAGLE part then one history part"),
        ("8_4_32+", "one EAGLE part then one history part"),
        ("disable+suffix_8", "exactly three underscore-separated integers"),
        ("+suffix_8", "exactly three underscore-separated integers"),
        ("2_2_8+suffix_8", "exceeds the tree capacity"),
        ("0_0_0+suffix_8", "must all be >= 1"),
    ],
)
def test_history_parse_errors_name_string_and_rule(text, rule):
    with pytest.raises(ValueError) as info:
        Strategy.parse(text)
    message = str(info.value)
    assert repr(text) in message
    assert rule in message


@pytest.mark.parametrize("fields", [(0, 0, 0, 1), (8, 4, 32, 1), (0, 0, 0, -2), (2, 2, 8, 8)])
def test_direct_construction_validates_history(fields):
    with pytest.raises(ValueError):
        Strategy(*fields)


def test_history_value_semantics():
    table = {Strategy.parse("suffix_16"): "a", Strategy.parse("8_4_32+suffix_16"): "b", Strategy(8, 4, 32): "c"}
    assert table[Strategy(0, 0, 0, 16)] == "a"
    assert table[Strategy(8, 4, 32, 16)] == "b"
    assert table[Strategy.parse("8_4_32")] == "c"
    assert Strategy(8, 4, 32) != Strategy(8, 4, 32, 16)
    space = parse_strategy_space(["suffix_16", "8_4_32+suffix_16", "8_4_32", "disable"])
    assert [str(s) for s in space] == ["suffix_16", "8_4_32+suffix_16", "8_4_32", "disable"]
    with pytest.raises(ValueError, match="duplicate strategy 'suffix_16'"):
        parse_strategy_space(["suffix_16", "disable", "suffix_16"])


def _eagle_parts():
    from hypothesis import strategies as st

    def complete(steps_topk):
        steps, topk = steps_topk
        if topk == 1:
            return st.just((steps, 1, steps + 1))
        return st.integers(2, max_tree_tokens(steps, topk)).map(lambda n: (steps, topk, n))

    return st.tuples(st.integers(1, 12), st.integers(1, 8)).flatmap(complete)


def test_round_trip_property():
    from hypothesis import given
    from hypothesis import strategies as st

    @given(eagle=st.none() | _eagle_parts(), history=st.none() | st.integers(2, 512))
    def check(eagle, history):
        if eagle is None and history is None:
            text = "disable"
        elif eagle is None:
            text = f"suffix_{history}"
        else:
            text = "_".join(map(str, eagle)) + ("" if history is None else f"+suffix_{history}")
        strategy = Strategy.parse(text)
        assert str(strategy) == text
        assert Strategy.parse(str(strategy)) == strategy
        assert hash(Strategy.parse(text)) == hash(strategy)
        assert strategy.history_nodes == (history or 0)
        assert strategy.uses_drafter == (eagle is not None)
        assert strategy.is_disabled == (eagle is None and history is None)

    check()


def test_garbage_never_crashes_property():
    from hypothesis import given
    from hypothesis import strategies as st

    @given(st.text(alphabet="suffix_0123456789+-dsable @.", max_size=24))
    def check(text):
        try:
            strategy = Strategy.parse(text)
        except ValueError as err:
            assert repr(text) in str(err)
        else:
            assert Strategy.parse(str(strategy)) == strategy

    check()


@pytest.mark.parametrize(
    ("text", "expected", "canonical"),
    [
        ("8_1_9@0.3", Strategy(8, 1, 9, stop_below=0.3), "8_1_9@0.3"),
        (" 8_1_9@.30 ", Strategy(8, 1, 9, stop_below=0.3), "8_1_9@0.3"),
        ("1_1_2@0.999", Strategy(1, 1, 2, stop_below=0.999), "1_1_2@0.999"),
        ("5_1_6@1e-6+suffix_8", Strategy(5, 1, 6, 8, 1e-6), "5_1_6@1e-06+suffix_8"),
    ],
)
def test_parse_chain_stop(text, expected, canonical):
    strategy = Strategy.parse(text)
    assert strategy == expected
    assert strategy.stops_early and strategy.uses_drafter
    assert str(strategy) == canonical
    assert Strategy.parse(canonical) == strategy
    fixed = Strategy(strategy.steps, 1, strategy.steps + 1, strategy.history_nodes)
    assert strategy != fixed and strategy.max_tree_nodes == fixed.max_tree_nodes


def test_chain_stop_truncated():
    strategy = Strategy.parse("8_1_9@0.3+suffix_4")
    assert strategy.truncated(3) == Strategy.parse("3_1_4+suffix_4")
    assert strategy.truncated(8) == Strategy.parse("8_1_9+suffix_4")
    assert not strategy.truncated(8).stops_early
    for bad in (0, 9):
        with pytest.raises(ValueError, match="cannot stop its chain at"):
            strategy.truncated(bad)
    with pytest.raises(ValueError, match="cannot stop its chain at"):
        Strategy.parse("8_4_32").truncated(2)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("8_4_32@0.3", "applies to a chain"),
        ("8_1_9@0", "probability in \\(0, 1\\)"),
        ("8_1_9@1", "probability in \\(0, 1\\)"),
        ("8_1_9@1.5", "probability in \\(0, 1\\)"),
        ("8_1_9@-0.2", "probability in \\(0, 1\\)"),
        ("8_1_9@nan", "probability in \\(0, 1\\)"),
        ("8_1_9@inf", "probability in \\(0, 1\\)"),
        ("8_1_9@", "probability in \\(0, 1\\)"),
        ("8_1_9@half", "probability in \\(0, 1\\)"),
        ("8_1_9@0.3@0.2", "optionally followed by '@P'"),
        ("suffix_8@0.3", "history part must be"),
        ("8_1_9+suffix_8@0.3", "history part must be"),
    ],
)
def test_chain_stop_parse_errors(text, rule):
    with pytest.raises(ValueError, match=rule) as err:
        Strategy.parse(text)
    assert repr(text) in str(err.value)


@pytest.mark.parametrize("stop", [True, "0.3", 1.0, 0.0 - 1e-9, float("nan")])
def test_chain_stop_direct_construction_validates(stop):
    with pytest.raises(ValueError, match="stop"):
        Strategy(8, 1, 9, stop_below=stop)


def test_chain_stop_round_trip_property():
    from hypothesis import given
    from hypothesis import strategies as st

    probabilities = st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)

    @given(steps=st.integers(1, 16), stop=probabilities, history=st.none() | st.integers(2, 64))
    def check(steps, stop, history):
        text = f"{steps}_1_{steps + 1}@{stop!r}" + ("" if history is None else f"+suffix_{history}")
        strategy = Strategy.parse(text)
        assert str(strategy) == text
        assert strategy.stop_below == stop and strategy.stops_early
        assert hash(Strategy.parse(str(strategy))) == hash(strategy)
        assert strategy.truncated(steps) == Strategy(steps, 1, steps + 1, history or 0)

    check()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("12_1_13@+0.3", "the stop after '@' must be a probability in \\(0, 1\\) written as a decimal"),
        ("12_1_13@0.3_0", "written as a decimal"),
        ("12_1_13@\u0660.\u0663", "written as a decimal"),  # Arabic-Indic digits, which float() reads
        ("12_1_13@ 0.3", "no blanks inside a strategy"),
        ("3_1_4 +suffix_8", "no blanks inside a strategy"),
        ("3_1_4+ suffix_8", "no blanks inside a strategy"),
    ],
)
def test_what_follows_at_is_a_plain_decimal_and_blanks_stay_outside(text, said):
    """'@+0.3' was called a malformed hybrid, '@ 0.3' and '@0.3_0' were read by float(); blanks around '+' were
    refused while blanks after '@' were taken: one rule for each now."""
    with pytest.raises(ValueError, match=said):
        Strategy.parse(text)


@pytest.mark.parametrize(("text", "canonical"), [("DISABLE", "disable"), ("SUFFIX_8", "suffix_8"),
                                                 ("3_1_4+Suffix_8", "3_1_4+suffix_8"), ("12_1_13@3E-1", "12_1_13@0.3"),
                                                 (" 5_1_6 ", "5_1_6")])  # fmt: skip
def test_letters_in_any_case(text, canonical):
    assert str(Strategy.parse(text)) == canonical


def test_selector_names_in_another_case_are_named():
    from fastrl.adaptive.factory import build_selector

    for name in ("BANDIT", "Ema"):
        with pytest.raises(ValueError, match=f"selector names are written '{name.lower()}'"):
            build_selector(name)
    assert str(build_selector("DISABLE").strategies[0]) == "disable"
