"""`fastrl generate` decodes with start-up's objects frozen out of the cyclic collector's way, and gives them back
(``fastrl.engine.heap``)."""

from __future__ import annotations

import gc
import json

from fastrl.cli import main


def test_generate_decodes_with_the_heap_settled_and_gives_it_back(model_dir, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [5 + i, 6, 7]}) + "\n" for i in range(4)))
    seen: list[int] = []

    def during(phase: str, info: dict) -> None:
        if phase == "stop":
            seen.append(gc.get_freeze_count())

    gc.callbacks.append(during)
    thresholds = gc.get_threshold()
    gc.set_threshold(100, 10**6, 10**6)  # young collections every 100 allocations (no older ones): some fall inside
    try:
        args = [f"model={model_dir}", f"prompts={prompts}", f"output={tmp_path / 'out.jsonl'}", "max_new_tokens=48"]
        assert main(["generate", *args, "batch_size=2", "progress=false", "strategy=disable"]) == 0
    finally:
        gc.callbacks.remove(during)
        gc.set_threshold(*thresholds)
    assert max(seen) > 0  # collections while decoding ran with start-up's objects frozen
    assert gc.get_freeze_count() == 0
