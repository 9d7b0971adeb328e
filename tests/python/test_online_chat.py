"""Multimodal rows: a `messages` column whose turns have list content is sent to vLLM as the chat
request with those messages, exactly as the reference sends it (the real speculators loaders against the
simulated server, which records every chat request); text-only rows go as token ids."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from dropin_helpers import assert_same, iterate, our_loaders, reference_loaders

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("both_paths")]

LAYERS, HIDDEN, MAX_LEN, ROWS = 4, 16, 160, 40


def multimodal_turns(k: int) -> list[dict]:
    """A user turn with text and an image, an assistant answer: list content, as speculators'
    preprocessing stores multimodal conversations (struct fields absent in a part become null)."""
    return [
        {"role": "user", "content": [
            {"type": "text", "text": f"Q{k}: what is in picture {k}? \u00e9\u4e2d", "image_url": None},
            {"type": "image_url", "text": None, "image_url": {"url": f"file:///images/{k}.png"}},
        ]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "A cat" + "!" * k, "image_url": None},
        ]},
    ]


def text_turns(k: int) -> list[dict]:
    return [{"role": "user", "content": f"plain question {k}"},
            {"role": "assistant", "content": "an answer" + "." * k}]


def sim_ids(turns: list[dict]) -> list[int]:
    """The simulated server's tokenizer: one id per character of the turns' text."""
    text = ""
    for turn in turns:
        content = turn["content"]
        if isinstance(content, str):
            text += content
        else:
            text += "".join(part.get("text") or "" for part in content)
    return [ord(c) for c in text]


def write_dataset(path: Path, turns_of) -> Path:
    from datasets import Dataset

    messages = [turns_of(k) for k in range(ROWS)]
    ids = [sim_ids(m) for m in messages]
    assert len({len(i) for i in ids}) == ROWS, "distinct lengths: the plans agree exactly"
    rng = np.random.default_rng(3)
    ds = Dataset.from_dict({
        "input_ids": ids,
        "loss_mask": [(rng.random(len(i)) < 0.6).astype(np.int64).tolist() for i in ids],
        "seq_len": [len(i) for i in ids],
        "messages": messages,
    })
    ds.set_format(type="torch")  # as speculators' preprocessing saves it
    ds.save_to_disk(str(path))
    (path / "hidden_states").mkdir()
    return path


@pytest.fixture(scope="module", params=["sim/verifier-vl", "mistralai/Mistral-Small-sim"])
def sim(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("chat_sim")
    with SimServerProcess(root / "server", model=request.param, layers=LAYERS, hidden=HIDDEN,
                          seed=11) as server:
        yield server


@pytest.fixture(autouse=True)
def clean(sim):
    sim.set_faults({})
    sim.reset()
    for leftover in Path(sim.server_dir).glob("*.safetensors"):
        leftover.unlink()


def args_for(data: Path, sim, **overrides):
    args = dict(
        data_path=str(data), total_seq_len=MAX_LEN, hidden_states_dtype=torch.bfloat16,
        transfer=None, vllm_endpoint=sim.url, on_missing="generate", verifier_name_or_path=None, request_timeout=30.0, max_retries=1,
        generation_validation_retries=0, max_consecutive_generation_failures=5,
        hidden_size=HIDDEN, num_target_layers=LAYERS - 1, num_workers=0, prefetch_factor=4,
        preprocess=None, train_data_ratio=0.75, seed=42,
    )
    args.update(overrides)
    return args


def by_text(requests: list[dict]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in requests)


def test_multimodal_rows_send_the_references_chat_requests(tmp_path, sim, topology, monkeypatch):
    topology(0, 1, via_env=False)
    data = write_dataset(tmp_path / "data", multimodal_turns)
    monkeypatch.setenv("DRAFTFEED_SERVER_DIR", str(sim.server_dir))
    ref_train, _ = reference_loaders(args_for(data, sim))
    expected = iterate(ref_train)
    ref_requests = sim.stats()["chat_requests"]
    sim.reset()
    ours, _ = our_loaders(args_for(data, sim, num_workers=2))
    got = iterate(ours)
    stats = sim.stats()
    assert stats["completions"] == 0, "every row is multimodal: no completions request"
    assert stats["chat"] == len(ref_requests) > 0
    assert by_text(stats["chat_requests"]) == by_text(ref_requests)
    mistral = "mistral" in sim.model.lower()
    assert all(r["continue_final_message"] is mistral for r in stats["chat_requests"])
    assert all(r["add_generation_prompt"] is False for r in stats["chat_requests"])
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        assert_same(a, b, f"multimodal batch {k}")
    assert sum(b["error_records"] for b in got) == 0


def test_text_only_messages_go_as_token_ids(tmp_path, sim, topology, monkeypatch):
    topology(0, 1, via_env=False)
    data = write_dataset(tmp_path / "data", text_turns)
    monkeypatch.setenv("DRAFTFEED_SERVER_DIR", str(sim.server_dir))
    ours, _ = our_loaders(args_for(data, sim, num_workers=2))
    got = iterate(ours)
    stats = sim.stats()
    assert stats["chat"] == 0 and stats["completions"] > 0
    assert sum(b["error_records"] for b in got) == 0


def test_generate_command_uses_the_chat_request(tmp_path, sim, run_cli):
    data = write_dataset(tmp_path / "data", multimodal_turns)
    proc = run_cli("generate", str(data), "--endpoint", sim.url, "--server-dir", str(sim.server_dir),
                   "--fetch-threads", "4", "--json", timeout=120)
    report = json.loads(proc.stdout)
    assert report["generated"] == ROWS == report["chat_rows"] and report["unfilled"] == 0
    assert sim.stats()["chat"] == ROWS and sim.stats()["completions"] == 0
    from safetensors.torch import load_file

    for row in (0, 17, ROWS - 1):
        loaded = load_file(str(data / "hidden_states" / f"hs_{row}.safetensors"))
        assert loaded["token_ids"].tolist() == sim_ids(multimodal_turns(row))


def test_unreadable_messages_drop_the_row_without_a_request(tmp_path, sim, run_cli):
    from datasets import Dataset

    ids = [[ord(c) for c in f"row {k} text"] for k in range(6)]
    Dataset.from_dict({
        "input_ids": ids, "loss_mask": [[1] * len(i) for i in ids], "seq_len": [len(i) for i in ids],
        # A binary field has no JSON form: the row's chat request cannot be built.
        "messages": [[{"role": "user", "content": [{"type": "image", "blob": b"\x00\x01"}]}]] * 6,
    }).save_to_disk(str(tmp_path / "data"))
    proc = run_cli("generate", str(tmp_path / "data"), "--endpoint", sim.url, "--json", check=False,
                   timeout=60)
    report = json.loads(proc.stdout)
    assert proc.returncode != 0
    assert report["bad_messages"] == 6 == report["unfilled"] and report["requests"] == 0
    assert "messages" in proc.stderr and "row 0" in proc.stderr
    assert sim.stats()["chat"] == 0 and sim.stats()["completions"] == 0


def test_loader_warns_when_the_online_source_cannot_read_messages(tmp_path, sim):
    import draftfeed

    data = write_dataset(tmp_path / "data", multimodal_turns)
    blind = draftfeed.online.OnlineSource(sim.url, hidden_states_path=tmp_path / "cache")
    assert blind.reads_messages is False
    with pytest.warns(UserWarning, match="messages column"):
        draftfeed.Loader(str(data), hidden_size=HIDDEN, total_seq_len=MAX_LEN, split="all",
                         num_target_layers=LAYERS - 1, source=blind)
    assert draftfeed.online.OnlineSource(sim.url, data_path=data).reads_messages is True
