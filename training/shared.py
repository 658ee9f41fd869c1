"""shared: what the lab's training modes share beyond train_heads.py (which holds the joint loss, the
one fit loop, evaluation and the corpus): the settings of every mode (RunConfig). Errors are
ValueErrors; the command line (training/cli.py) makes them one line and exit 2.
"""
from dataclasses import dataclass, fields

import train_heads


# ----------------------------------------------------------------------------- the settings of a run

@dataclass
class RunConfig(train_heads.TrainConfig):
    """Every setting a training run reads: the base run's (train_heads.TrainConfig) and those of
    the fine-tuning modes, train_heads.py's flags of the same names (argparse stays in
    training/cli.py: RunConfig.from_args), so the library takes one typed object. The defaults
    are the base model's run; --distill, --tasks and --smollm change some (training/finetune.py)."""
    distill: str = None           # --distill: 'frozen' or 'joint'
    base: str = None              # --distill, --tasks: the checkpoint to start from
    regen_every: int = 50         # --distill: steps between regenerations of the greedy data
    gen_rows: int = 128           # --distill: greedy continuations per regeneration
    anchor: float = 0.0           # --distill joint: weight of head 1's KL from the base
    teacher: str = "current"      # --distill: who generates the greedy data
    teacher_tokens: int = 0       # --smollm: positions of teacher forcing before self-distillation
    teacher_steps: int = 0        # --smollm: optimizer steps on them
    teacher_targets: str = "exact"  # --smollm: 'exact' (greedy's tokens only) or 'all' argmaxes
    draft_vocab: int = 0          # --smollm: tokens heads 2..h draft among (0: all)
    head_form: str = "stern"      # --smollm: heads 2..h's form (models.llama.HEAD_FORMS)
    continuations: int = 0        # --smollm: train-split greedy continuations (0: CONTINUATIONS')
    chat_continuations: int = 0   # --smollm: train-split chat-question ones (0: none)

    @classmethod
    def from_args(cls, args):
        """The settings from an argparse Namespace (training.cli.parse_args), by field name."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})
