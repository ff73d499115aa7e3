"""The pieces of `eval.py fixes` (evaluation/fixes.py) that need no model.

Kind: property tests on a stand-in vocabulary, no model.
1. AnswerLineConstraint: whatever the policy's scores (random, or set on ending at once, or on never
   ending), every response sampled under it ends with a line "Answer: <integer>" and the end token,
   within the budget, so the verifier reading that line finds one well-formed answer; free text
   keeps the policy's own probabilities, and the probability of ending moves to starting the line.
2. FinalLineTask scores the last line only; RetryEngine samples again only the answers whose format
   fails, up to its tries, and counts every try's tokens.
3. Every arm's preconditions (a tokenizer the schema arm can constrain, a budget that holds its
   line, a writable --out, the RL policy's vocabulary) are checked before the model loads and
   before any arm generates: a refusal after the arms before it lost their work.
The whole command on SmolLM2 is smoke-tested in tests/test_smollm2.py.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_fixes.py
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

import train
import verifier
from evaluation import fixes
from evaluation.fixes import AnswerLineConstraint, FinalLineTask, RetryEngine
from plumbing import policy as policy_mod
from rollout import Engine, Sample, SamplingParams
from task import FORMAT_ERRORS, Problem, Task

PIECES = ["<end>", "\n", "Answer", ":", " ", "-", *"0123456789", "the", " sum", " is", " Answer", "=", " 7",
          "x", "answer", "\n\n"]


class Vocab:
    """A stand-in tokenizer: greedy longest match over PIECES; decode joins them."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            j = max((k for k, p in enumerate(PIECES) if p and text.startswith(p, i)), key=lambda k: len(PIECES[k]))
            out.append(j)
            i += len(PIECES[j])
        return out

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(PIECES[i] for i in ids if not (skip_special_tokens and i == 0))


def _sample(constraint, scores_of, budget: int, gen: torch.Generator) -> list[int]:
    """One response drawn step by step from softmax(constraint(generated, scores))."""
    out = []
    for _ in range(budget):
        scores = constraint(torch.tensor([out], dtype=torch.long).reshape(1, len(out)), scores_of(out)[None])[0]
        tok = int(torch.multinomial(torch.softmax(scores, -1), 1, generator=gen))
        out.append(tok)
        if tok == 0:
            break
    return out


LINE = re.compile(r"(?:.*\n)?Answer: -?[0-9]{1,12}", re.DOTALL)


@pytest.mark.parametrize("policy", ["random", "ends_at_once", "never_ends", "answer_word"])
@pytest.mark.parametrize("budget", [9, 10, 16, 40])
def test_every_response_ends_with_an_answer_line_within_the_budget(policy, budget):
    vocab, gen = Vocab(), torch.Generator().manual_seed(budget)
    c = AnswerLineConstraint(vocab, [0], budget)
    V = len(PIECES)

    def scores_of(generated):
        s = torch.randn(V, generator=gen) * 3
        if policy == "ends_at_once":
            s[0] += 20
        elif policy == "never_ends":
            s[0] -= 1e4
            s[PIECES.index("\n")] -= 1e4
        elif policy == "answer_word":
            s[PIECES.index("Answer")] += 5
        return s

    for _ in range(25):
        ids = _sample(c, scores_of, budget, gen)
        text = vocab.decode(ids[:-1])
        assert ids[-1] == 0 and len(ids) <= budget, (text, ids)
        assert LINE.fullmatch(text), text
        last = text.split("\n")[-1]
        assert verifier.score(last, "7").reason not in FORMAT_ERRORS


def test_free_text_keeps_the_policy_and_ending_starts_the_line():
    vocab = Vocab()
    c = AnswerLineConstraint(vocab, [0], 40)
    scores = torch.log(torch.tensor([0.3] + [0.7 / (len(PIECES) - 1)] * (len(PIECES) - 1)))  # 30% on ending
    out = c(torch.tensor([[PIECES.index("the")]]), scores[None])[0]
    p = torch.softmax(out, -1)
    nl = PIECES.index("\n")
    assert p[0] == 0 and p[nl] == pytest.approx(0.3 + 0.7 / (len(PIECES) - 1), rel=1e-5)
    others = [i for i in range(len(PIECES)) if i not in (0, nl)]
    assert torch.allclose(p[others], torch.softmax(scores, -1)[others], rtol=1e-5)
    after_nl = torch.softmax(c(torch.tensor([[PIECES.index("the"), nl]]), scores[None])[0], -1)
    assert after_nl[PIECES.index("Answer")] == pytest.approx(0.3 + 0.7 / (len(PIECES) - 1), rel=1e-5)


def test_a_tokenizer_that_splits_the_pieces_or_a_short_budget_is_refused():
    class Chars(Vocab):
        def encode(self, text, add_special_tokens=False):
            return [ord(ch) for ch in text]

    with pytest.raises(ValueError, match="single tokens"):
        AnswerLineConstraint(Chars(), [0], 40)
    with pytest.raises(ValueError, match="at least 9 tokens"):
        AnswerLineConstraint(Vocab(), [0], 8)


def test_final_line_task_reads_the_last_line_only():
    t = FinalLineTask(Task())
    p = Problem("p", [], "7")
    got = t.score(["Answer: 3 \\boxed{5}\nthe sum is 4\nAnswer: 7", "Answer: 7\nAnswer: 7x"], p, train.Config())
    assert [s.correct for s in got] == [True, False]


class Scripted(Engine):
    """Returns, for each request, samples from a script: the i-th request's texts in order."""

    name, version, seeded = "scripted", "0", True

    def __init__(self, vocab, script):
        super().__init__()
        self.vocab, self.script, self.calls = vocab, list(script), []

    def generate(self, prompts, params):
        texts = self.script.pop(0)
        self.calls.append((len(prompts), params.n, params.seed))
        it = iter(texts)
        return [[Sample(self.vocab.encode(next(it)), "stop") for _ in range(params.n)] for _ in prompts]


def test_retry_samples_again_only_bad_formats_up_to_its_tries():
    vocab = Vocab()
    inner = Scripted(vocab, [["Answer: 7", "the sum", "x", "Answer: 3"],  # 2 prompts x n=2: two bad formats
                             ["the", "Answer: 7"],  # retry 1: the first still bad
                             ["x"]])  # retry 2: still bad, and no tries left
    eng = RetryEngine(inner, vocab, Task(), train.Config(), tries=3)
    out = eng.generate([[1], [2]], SamplingParams(n=2, max_new_tokens=8, seed=5))
    texts = [[vocab.decode(s.token_ids) for s in g] for g in out]
    assert texts == [["Answer: 7", "x"], ["Answer: 7", "Answer: 3"]]
    assert inner.calls == [(2, 2, 5), (2, 1, 5 + 7919), (1, 1, 5 + 2 * 7919)]  # only the failures, each try a new seed
    assert sorted(eng.tries_used) == [1, 1, 2, 3]
    assert eng.tokens == sum(len(vocab.encode(t)) for t in ["Answer: 7", "the sum", "x", "Answer: 3", "the", "Answer: 7", "x"])


def test_every_arms_preconditions_are_checked_before_the_model_loads_or_any_arm_generates(tmp_path, monkeypatch):
    """The tiny base model's character tokenizer cannot be constrained: refused before the prompt, instruction and
    one-shot arms generate (they come first), before the model loads, and before --out is written to."""
    calls = []
    monkeypatch.setattr(policy_mod, "load_model", lambda *a, **k: calls.append("load_model"))
    monkeypatch.setattr(fixes, "evaluate", lambda *a, **k: calls.append("evaluate"))
    with pytest.raises(ValueError) as e:
        fixes.main(["--preset", "smollm2-arith", "--model", "assets/tiny-base", "--k", "1", "--limit", "2",
                    "--out", str(tmp_path / "out")], presets=train.PRESETS)
    assert str(e.value).startswith("eval.py fixes, the schema arm: the schema constraint needs a tokenizer that writes")
    assert str(e.value).endswith("pass --max_new_tokens >= 9 and a model whose tokenizer fits, or --arms without schema")
    assert calls == [] and not list((tmp_path / "out").iterdir())


def test_the_preconditions_name_the_budget_the_output_folder_and_the_rl_policys_vocabulary(tmp_path):
    args = SimpleNamespace(out=str(tmp_path / "out"), arms=["prompt", "schema"], model="", preset="smollm2-arith")
    with pytest.raises(ValueError, match="the schema arm: the schema constraint needs a response budget of at least 9 "
                                         "tokens, got 8"):
        fixes.preconditions(args, Vocab(), 8, None)
    assert fixes.preconditions(args, Vocab(), 9, None) == {}
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):  # --out names a file: refused before the arms, not after
        fixes.preconditions(SimpleNamespace(**{**vars(args), "out": str(tmp_path / "file" / "out")}), Vocab(), 9, None)
    base = policy_mod.load_tokenizer("")
    trained = tmp_path / "trained"
    policy_mod.save_plain_tokenizer(base, trained)
    args = SimpleNamespace(**{**vars(args), "arms": ["prompt"]})
    assert fixes.preconditions(args, base, 48, trained)["rl"]["model"] == str(trained)  # the same vocabulary
    with pytest.raises(ValueError, match=r"--trained .*: its tokenizer is not the base model's"):
        fixes.preconditions(args, _Other(base), 48, trained)


class _Other:
    """A tokenizer with another vocabulary than `inner`'s."""

    def __init__(self, inner):
        self.inner = inner

    def get_vocab(self):
        return {**self.inner.get_vocab(), "<|extra|>": 999}
