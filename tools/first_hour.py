"""A student's first hour, scripted (issue 43): the traps a fresh clone met, checked again.

    python tools/first_hour.py          # about a minute; run from the repository, installed (-e .)

1. A script next to a clone named minibpd/ imports minibpd (the clone is made with `git clone`).
2. The README's "In your own code" block, timed as printed and with torch's default threads
   (the README sets 1 thread: with torch's default it ran 55x slower on a 2-core machine),
   against the command `python minibpd.py --prompt ... --max-new-tokens 100` (1 thread).
3. A plug-in that is not where the command looks, and a drafter returning a flat list: the
   messages a student sees.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, cwd, **kw):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t0 = time.perf_counter()
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, **kw)
    return r, time.perf_counter() - t0


def readme_code():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "bpd_decode(" in b)


def main():
    tmp = tempfile.mkdtemp()
    subprocess.run(["git", "clone", "-q", ROOT, os.path.join(tmp, "minibpd")], check=True)
    r, _ = run([sys.executable, "-c", "from minibpd import bpd_decode; print('ok')"], tmp)
    print(f"1. next to a clone named minibpd/: {'ok' if r.returncode == 0 else r.stderr.strip()[-200:]}")
    code = readme_code()
    r, printed = run([sys.executable, "-c", code], tmp)
    unset = code.replace("torch.set_num_threads(1)", "pass")
    r2, default = run([sys.executable, "-c", unset], tmp)
    r3, command = run([sys.executable, "minibpd.py", "--prompt", "The import statement",
                       "--max-new-tokens", "100"], ROOT)
    print(f"2. the README's code: {printed:.1f} s as printed, {default:.1f} s at torch's default "
          f"threads ({os.cpu_count()} cores); the command: {command:.1f} s "
          f"({'all ran' if not (r.returncode or r2.returncode or r3.returncode) else 'a run failed'})")
    r, _ = run([sys.executable, os.path.join(ROOT, "minibpd.py"), "--plugin", "my_drafter",
                "--demo"], tmp)
    print(f"3. --plugin my_drafter, no such file here: {r.stderr.strip().splitlines()[-1]}")
    r, _ = run([sys.executable, "-c", FLAT], tmp)
    print(f"   a drafter returning one flat draft: {r.stderr.strip().splitlines()[-1]}")


FLAT = """
import minibpd
class Flat:
    max_drafts = 1
    def __call__(self, logprobs, context):
        return [context[-1]] + logprobs[1:].argmax(-1).tolist()    # a draft, not [draft]
model, ck = minibpd.load_checkpoint()
minibpd.bpd_decode(model, [1, 2, 3], 20, drafter=Flat())
"""


if __name__ == "__main__":
    main()
