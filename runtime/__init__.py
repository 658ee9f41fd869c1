"""runtime: what the paper's code stands on: the KV cache and the model calls that fill it
(kvcache), the lossless sampling rule (sampling), Stern §5's APPROXIMATE acceptance rules, off
unless named (approximate), the lab's entry to the decode loop, its request checked (loop),
reading checkpoints and text safely (checkpoint), and the thread policy (threads). Imports
nothing above it."""
