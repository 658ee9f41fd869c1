"""Can the paper's tests fail? Each mutant below breaks one line of a paper file the way a student
(or we) might; `pytest test_minibpd.py`, run on the paper files alone, must fail on it. A mutant
it misses is run against the repository test file named beside it, which must fail instead.
Not part of every CI run: it takes minutes.

    python .ci/mutants.py            # every mutant
    python .ci/mutants.py 3 7        # mutants 3 and 7
Exit status 1 if a mutant passes both.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (file, line as it is, line as the mutant has it, what it breaks, the repository test file)
MUTANTS = [
    ("minibpd.py", "return z[:, len(tail) - 1:]", "return z[:, len(tail):]",
     "verify reads the states one position late", "tests/runtime/test_kvcache.py"),
    ("minibpd.py", "        self.length += n\n", "        self.length += n + (n > 3)\n",
     "the cache keeps a slot it should drop", "tests/runtime/test_kvcache.py"),
    ("minibpd.py", "        if start != self.start:", "        if False:",
     "a new window keeps the old window's keys", "tests/runtime/test_kvcache.py"),
    ("minibpd.py", "t[:, :, new] = t[row:row + 1, :, new]", "pass",
     "the winning row's keys are not copied to every row", "tests/runtime/test_kvcache.py"),
    ("minibpd.py", "mask = torch.ones(L, start + L, dtype=torch.bool, device=idx.device).tril(start)",
     "mask = None", "a verified block sees its later drafted tokens", "tests/runtime/test_kvcache.py"),
    ("minibpd.py", "return max(0, min(most, end - t, window_start(t, block_size) + block_size - t))",
     "return max(0, min(most, end - t))", "drafts run past the context window",
     "tests/runtime/test_contract.py"),
    ("minibpd.py", "if d != c),", "if d != c and i < 2),",
     "accept keeps drafted tokens past the first miss", "tests/runtime/test_contract.py"),
    ("minibpd.py", "row = kept.index(max(kept))", "row = kept.index(min(kept))",
     "p-best keeps the draft accepted least far", "tests/runtime/test_contract.py"),
    ("minibpd.py", "return row, kept, choices[row][kept], {",
     "return row, kept, choices[row][max(0, kept - 1)], {",
     "the free token is greedy's choice one position early", "tests/runtime/test_contract.py"),
    ("minibpd.py", "new = drafts[row][1:kept + 1] + [token]",
     "new = drafts[row][1:kept + 1] + [token] * (kept < 3)", "a step drops the free token",
     "tests/runtime/test_contract.py"),
    ("minibpd.py", "        if d[0] != first:\n", "        if False:\n",
     "the contract's first-token rule goes unchecked", "tests/runtime/test_contract.py"),
    ("minibpd.py", "return z + self.proj(F.gelu(self.fc(z)))", "return self.proj(F.gelu(self.fc(z)))",
     "a head loses its residual connection (Stern Fig. 3)", "tests/training/test_train_heads.py"),
    ("minibpd.py", "or not len(set(vocab)) == len(vocab) == model.config.vocab_size:", ":",
     "a checkpoint's vocabulary goes unchecked", "tests/lab/test_trust.py"),
    ("train_heads.py", "targets = torch.stack([chunk[:, 1 + i:1 + i + T]",
     "targets = torch.stack([chunk[:, i:i + T]", "head i is trained on token t + i - 1",
     "tests/training/test_train_heads.py"),
    ("lattice.py", "top = (np.argsort(-lp, axis=1", "top = (np.argsort(lp, axis=1",
     "the lattice holds the k worst tokens", "tests/test_lattice.py"),
    ("lattice.py", "new_state = (state + (tok,))[-n:] if n else ()",
     "new_state = (state + (tok,))[-n - 1:][:n] if n else ()",
     "the DP's state is the wrong n - 1 tokens", "tests/test_lattice.py"),
    ("lattice.py", "lm.logprob(tok, list(state))", "lm.logprob(tok, list(state)[1:])",
     "the DP asks the LM with a token of context too few", "tests/test_lattice.py"),
    ("lattice.py", "return [(s, list(toks)) for s, _, toks in finals[:p]]",
     "return [(s, list(toks)) for s, _, toks in finals[:p]][::-1]",
     "the p best paths come worst first", "tests/test_lattice.py"),
    ("lattice.py", "if cands[p - 1][0] > c[0] + tol:", "if True:",
     "pruning drops a path that ties after rounding", "tests/test_lattice.py"),
    ("lattice.py", "return (1 - alpha) * head_logprob + alpha * lm_logprob",
     "return alpha * head_logprob + (1 - alpha) * lm_logprob",
     "alpha weighs the heads, not the LM", "tests/test_lattice.py"),
    ("lattice.py", "self.search(lat, context[:-1])", "self.search(lat, context)",
     "global rescoring's LM reads the verified token twice", "tests/decoders/test_refine.py"),
    ("lattice.py", "lm = lm_logprobs(context + draft[1:])", "lm = lm_logprobs(context)",
     "local rescoring's LM never sees the tokens picked", "tests/decoders/test_refine.py"),
    ("lattice.py", "path.append(g if hit else cands[0])", "path.append(cands[0])",
     "the oracle never follows greedy", "tests/test_lattice.py"),
    ("ngram.py", "p = self.terms[j].get((c, token), 0.0) + \\",
     "p = self.terms[j].get((c, token), 0.0) * 1.01 + \\",
     "the n-gram LM's probabilities no longer sum to 1", "tests/test_ngram.py"),
    ("ngram.py", "estimates = (1 - 2 * y * n2 / n1,", "estimates = (1 - y * n2 / n1,",
     "modified Kneser-Ney's D1 is wrong", "tests/test_ngram.py"),
    ("ngram.py", "return Counter(gram[1:] for gram in longer_grams)",
     "return Counter(gram[:-1] for gram in longer_grams)",
     "continuation counts count right extensions, not left ones", "tests/test_ngram.py"),
    ("minibpd.py", "return max(0, min(most, end - t, window_start(t, block_size) + block_size - t))",
     "return max(0, min(most, end - t, window_start(t, block_size) + block_size - t - 1))",
     "drafts stop one token short of the window's edge: exact, but more calls",
     "tests/runtime/test_contract.py"),
]


def pytest_fails(folder, test_file):
    """-> (True if pytest failed, its summary line)."""
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci")     # a failing example is reported unshrunk
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           test_file], cwd=folder, capture_output=True, text=True, env=env)
    return done.returncode != 0, (done.stdout.strip().splitlines() or [""])[-1]


def copies():
    """Two copies of the repository: the paper files with checkpoints/ alone, and all of it."""
    alone, whole = tempfile.mkdtemp(), os.path.join(tempfile.mkdtemp(), "repo")
    for f in os.listdir(HERE):
        if f.endswith(".py"):
            shutil.copy(os.path.join(HERE, f), alone)
    shutil.copytree(os.path.join(HERE, "checkpoints"), os.path.join(alone, "checkpoints"))
    shutil.copytree(HERE, whole, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__"))
    return alone, whole


def main(chosen):
    alone, whole = copies()
    failed, summary = pytest_fails(alone, "test_minibpd.py")
    print(f"unmutated: test_minibpd.py alone: {summary}", flush=True)
    if failed:
        return 1
    missed = 0
    for number, (name, line, mutant, breaks, repo_test) in enumerate(MUTANTS, 1):
        if chosen and number not in chosen:
            continue
        source = open(os.path.join(HERE, name)).read()
        assert source.count(line) == 1, f"mutant {number}: {line!r} is not once in {name}"
        for folder in (alone, whole):
            open(os.path.join(folder, name), "w").write(source.replace(line, mutant))
        caught, summary = pytest_fails(alone, "test_minibpd.py")
        report = f"{number:2d} {name}: {breaks}: test_minibpd.py {'fails' if caught else 'PASSES'}"
        if not caught:
            caught, summary = pytest_fails(whole, repo_test)
            report += f"; {repo_test} {'fails' if caught else 'PASSES'}"
        print(f"{report} ({summary})", flush=True)
        missed += not caught
        for folder in (alone, whole):
            open(os.path.join(folder, name), "w").write(source)
    print(f"{missed} mutant(s) passed every test run on them")
    return int(missed > 0)


if __name__ == "__main__":
    raise SystemExit(main({int(a) for a in sys.argv[1:]}))
