"""1 thread against 2 (torch's default here), idle and with one competing busy process: the
measurement behind docs/results/threads.md's table and the default of every command.

    python tools/threads.py            # ~2 minutes on 2 cores; run it on an otherwise idle machine

Each configuration runs in a fresh process (torch fixes its thread pool at start-up): greedy and
BPD tok/s over one 64-character prompt, 128 tokens, median of 5 after a warm-up; one training
step of the default model (batch 32 x 136), mean of 6 after 2 warm-up steps.
"""
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(threads):
    import torch
    sys.path.insert(0, HERE)
    from minibpd import GPT, GPTConfig, bpd_decode, greedy_decode
    from lab.timing import seconds
    from runtime.checkpoint import load  # noqa: E402 (the lab's loader: FastGPT, SmolLM2)
    from runtime.corpus import encode
    from train_heads import joint_loss
    torch.set_num_threads(threads)
    model, ck = load()
    prompt = encode(ck["splits"]["test"][:64], ck["vocab"])
    tps = {}
    for name, fn in (("greedy", lambda: greedy_decode(model, prompt, 128)),
                     ("bpd", lambda: bpd_decode(model, prompt, 128))):
        fn()
        tps[name] = 128 / statistics.median([seconds(fn) for _ in range(5)])
    torch.manual_seed(0)
    net = GPT(GPTConfig(len(ck["vocab"]), 128, 6, 4, 128, 8)).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randint(len(ck["vocab"]), (32, 136))
    for i in range(8):
        if i == 2:
            t0 = time.perf_counter()
        loss, _ = joint_loss(net, x, 0.2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    step = (time.perf_counter() - t0) / 6 * 1e3
    print(f"{threads} thread(s): greedy {tps['greedy']:.0f} tok/s, BPD {tps['bpd']:.0f} tok/s, "
          f"training step {step:.0f} ms", flush=True)


def main():
    for busy in (False, True):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            time.sleep(1 if busy else 0)
            print("one other busy process:" if busy else "idle:", flush=True)
            for threads in (1, 2):
                subprocess.run([sys.executable, __file__, "--child", str(threads)], check=True)
        finally:
            if hog:
                hog.kill()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]))
    else:
        main()
