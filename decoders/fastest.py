"""Per machine: on how many of its heads the model's plain BPD is fastest here (the tuned file's
block efficiency by heads over this machine's measured call costs)."""


def speed_heads(be, call_ms):
    """The number of heads k whose plain BPD is fastest here by the measure at hand: block
    efficiency with k heads (be, the tuned file's) over the cost of a k-row decode call on this
    machine (call_ms[k - 1], models/machine.call_costs): tokens per ms. Ours (Stern §7.3, Table 4:
    speedup rises with the block size k, then falls). None where either is missing; ties go to
    more heads."""
    if not be or not call_ms:
        return None
    ks = [k for k in range(1, len(call_ms) + 1) if k in be and call_ms[k - 1] > 0]
    return max(ks, key=lambda k: (be[k] / call_ms[k - 1], k)) if ks else None


def fastest_view(model, be, switch=True):
    """The model on the heads whose BPD is fastest on this machine (speed_heads: `be`, the tuned
    file's block efficiency by heads, over the model's measured call costs, model.call_ms:
    SmolLM2's), said in model.machine; the model itself where either is missing or all heads
    win. --prompt and --demo use it without --heads; the bench (switch False) keeps every head,
    its block efficiency the machine-independent one, and only says which would be fastest."""
    h = model.config.n_bpd_heads
    k = speed_heads(be, getattr(model, "call_ms", None))
    if k in (None, h):
        return model
    if not switch:
        model.machine = f"{model.machine}; BPD fastest here on {k} of its {h} heads (`--heads {k}`)"
        return model
    view = model.first_heads(k)
    view.machine = f"{model.machine}; BPD on {k} of its {h} heads, fastest here (`--heads {h}`: all)"
    return view
