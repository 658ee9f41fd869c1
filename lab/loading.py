"""loading: the model, its checkpoint, each decoder's settings and the Resources the drafters
share, for every mode; each decoder's settings checked against the model's budgets and its
drafter built before any model call.
"""
import decoders
from lab.checks import overrides, resolve_device
from runtime.checkpoint import DTYPES, load as load_fast


def load_mode(args, used=None):
    """(model, checkpoint, {decoder: settings}, Resources), the settings of the decoders `used`
    (default: all) checked against the model's budgets; no model call yet."""
    # the lab's loader: FastGPT (minibpd.GPT's heads in one product) or another model family
    model, ck = load_fast(args.checkpoint, resolve_device(args.device), DTYPES.get(args.dtype))
    if args.heads is not None:
        model = model.first_heads(args.heads)
    else:                             # for speed in --prompt and --demo; the bench runs every head
        model = decoders.fastest_view(model, getattr(args, "heads_be", {}),
                                      args.mode in ("prompt", "demo"))
    chosen = decoders.settings(args.tuned_settings, overrides(args))    # read by the checks
    res = decoders.Resources(model, ck, reference=args.reference)    # --reference: the one switch
    build_drafters(decoders.active() if used is None else used, chosen, res)
    return res.model, ck, chosen, res


def build_drafters(names, chosen, res):
    """Check each decoder's settings against the model's budgets, and build its drafter (every
    drafter builds before any model call)."""
    for name in names:
        decoders.check(name, chosen[name], res.model)
        decoders.make(name, res, chosen[name])
