"""Fifth data round (issue 8): the static generator's sampling path, the HumanEval-shaped function
prompts, the Magpie filter and round file, and the DSpark job's extra held-out rows, on CPU."""
from __future__ import annotations

import ast
from pathlib import Path

import torch

from engine.training import corpus, corpus_r5, gpu_job, gpu_job_dspark
from engine.training.fast_generate import generate_answers_static, sample_tokens


def _model(hf: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()


def test_sampling_path_of_the_static_generator(tiny_llama_hf: Path) -> None:
    model = _model(tiny_llama_hf)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(20, model.config.vocab_size, (int(n),), generator=g).tolist() for n in (5, 9, 3)]
    greedy = generate_answers_static(model, prompts, 16, 3, -1, 0, log=lambda s: None, dtype=torch.float32)
    # a nucleus that keeps only the top token is greedy decoding
    tiny_p = generate_answers_static(model, prompts, 16, 3, -1, 0, log=lambda s: None, dtype=torch.float32,
                                     temperature=1.0, top_p=1e-9)
    assert tiny_p == greedy
    # the same prompt many times: sampled rows differ, and the same seed repeats them
    same = [prompts[0]] * 8
    a = generate_answers_static(model, same, 16, 8, -1, 0, log=lambda s: None, dtype=torch.float32, seed=3,
                                temperature=1.0, top_p=0.95)
    b = generate_answers_static(model, same, 16, 8, -1, 0, log=lambda s: None, dtype=torch.float32, seed=3,
                                temperature=1.0, top_p=0.95)
    assert a == b and len({tuple(x) for x in a}) > 1 and all(len(x) == 16 for x in a)
    # an EOS drawn by sampling ends that row's answer (EOS kept)
    eos = a[0][1]
    c = generate_answers_static(model, same, 16, 8, eos, 0, log=lambda s: None, dtype=torch.float32, seed=3,
                                temperature=1.0, top_p=0.95)
    assert c[0] == a[0][:2] and all(eos not in x[:-1] for x in c)


def test_sample_tokens_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4000))
    gen = torch.Generator().manual_seed(0)
    got = sample_tokens(logits, 1.0, 0.75, gen)
    counts = torch.bincount(got, minlength=4).tolist()
    assert counts[2] == counts[3] == 0 and counts[0] > counts[1] > 0  # 0.5 + 0.3 reach 0.75: tokens 0, 1 only
    assert sample_tokens(logits, 0.0, 0.75).tolist() == [0] * 4000


def test_function_stub_and_benchmark_ngrams(tmp_path: Path) -> None:
    src = ('import math\nimport os\nfrom typing import List\n\n\n'
           'def mean_of(xs: List[float]) -> float:\n'
           '    """Return the arithmetic mean of a list of numbers.\n\n    >>> mean_of([1.0, 3.0])\n    2.0\n    """\n'
           '    total = math.fsum(xs)\n    return total / len(xs)\n')
    tree = ast.parse(src)
    lines = src.splitlines()
    stub = corpus_r5.function_stub(tree.body[3], lines, corpus_r5._module_imports(tree, lines))
    assert stub.startswith("import math\nfrom typing import List\n\n\ndef mean_of(xs: List[float]) -> float:\n")
    assert stub.endswith('    2.0\n    """\n') and "fsum" not in stub and "import os" not in stub
    (tmp_path / "m.py").write_text(src)
    assert [name for name, _ in corpus_r5.iter_functions(tmp_path)] == ["m.mean_of"]
    bench = corpus_r5.ngram_hashes("Please return the arithmetic mean of a list of numbers now")
    assert corpus_r5.overlaps(stub, bench) and not corpus_r5.overlaps(stub, corpus_r5.ngram_hashes("other words"))
    assert not corpus_r5.overlaps(stub, set())


def test_magpie_filter_and_round_file() -> None:
    eos = 2
    dec = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    samples = [list(range(10, 22)) + [eos],  # kept
               list(range(10, 22)) + [eos],  # exact duplicate
               list(range(10, 20)) + [99, 98, eos],  # same first 10 tokens
               [5, 6, eos],  # too short
               list(range(30, 45)),  # never ended
               list(range(50, 60)) + [eos],  # kept
               list(range(60, 72)) + [eos]]  # benchmark 8-gram
    bench = corpus_r5.ngram_hashes(dec(list(range(60, 72))))
    texts, stats = corpus_r5.filter_magpie(samples, eos, dec, bench)
    assert texts == [dec(list(range(10, 22))), dec(list(range(50, 60)))]
    assert (stats["dup"], stats["near_dup"], stats["length"], stats["unended"], stats["bench"]) == (1, 1, 1, 1, 1)
    R = lambda i, k: corpus.PromptRow(f"{k}{i}", k, "", "", [i])  # noqa: E731
    held = [R(i, "h") for i in range(3)]
    mg, fn, old = [R(i, "mg") for i in range(5)], [R(i, "fn") for i in range(4)], [R(i, "old") for i in range(6)]
    merged = corpus_r5.merge_round_file(held, [mg, fn], 2, old)
    assert [r.id for r in merged[:7]] == ["h0", "h1", "h2", "mg0", "mg1", "fn0", "fn1"]
    assert sorted(r.id for r in merged[7:12]) == ["fn2", "fn3", "mg2", "mg3", "mg4"]
    assert [r.id for r in merged[12:]] == [f"old{i}" for i in range(6)]


def test_dspark_job_extra_heldout_rows(tiny_llama_hf: Path, tmp_path: Path) -> None:
    """--extra-heldout holds out the first N rows of the named kinds, never trains on them, and reports
    their τ (starting draft and trained draft) apart from the main held-out set."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_hf)
    rows, _ = corpus.build_corpus(12, 12, seed=2)
    prompts = tmp_path / "p.jsonl.gz"
    corpus.write_rows(corpus.tokenize_rows(tok, rows, 160), prompts)
    base = ["--target", str(tiny_llama_hf), "--out", str(tmp_path / "o1"), "--device", "cpu", "--heldout", "4",
            "--new-tokens", "24", "--gen-batch", "16", "--layers", "1", "--block-size", "4", "--taps", "0,2",
            "--markov-rank", "8", "--batch", "8", "--anchors", "8", "--warmup", "1", "--log-every", "5",
            "--eval-cands", "2,4", "--eval-rows", "4", "--save-every", "0", "--no-bf16", "--steps", "3",
            "--gen-impl", "static", "--gen-dtype", "float32"]
    cache = tmp_path / "a.jsonl.gz"
    m1 = gpu_job_dspark.main(base + ["--data-cache", str(cache), "--prompts", str(prompts)])
    args2 = base + ["--data-cache", str(cache), "--prompts", str(prompts), "--init-from", str(tmp_path / "o1" / "draft"),
                    "--extra-heldout", "2", "--extra-heldout-kinds", "code,chat"]
    args2[args2.index("--out") + 1] = str(tmp_path / "o2")
    m2 = gpu_job_dspark.main(args2)
    assert m2["data"]["prompts_heldout"] == m1["data"]["prompts_heldout"] == 2  # 4, capped at a tenth
    assert m2["data"]["prompts_extra_heldout"] == 4
    assert m2["data"]["prompts_train"] == m1["data"]["prompts_train"] - 4
    for key in ("heldout_extra", "heldout_extra_init"):
        for n in ("2", "4"):
            walk = m2[key][n]["topk"]["tokens_per_step"]
            assert {"all", "code", "chat"} <= set(walk) and 1.0 <= walk["all"] <= int(n) + 1
    assert set(m2["heldout"]["2"]["topk"]["tokens_per_step"]) == set(m1["heldout"]["2"]["topk"]["tokens_per_step"])
    assert len(gpu_job.load_data_tokens(cache)) == len(corpus.read_rows(prompts))
