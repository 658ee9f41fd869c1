"""runtime: what the paper's code stands on: the KV cache and the model calls that fill it
(kvcache), the lossless sampling rule (sampling), Stern §5's APPROXIMATE acceptance rules, off
unless named (approximate), the check of a decode request (request), reading checkpoints and
text safely (checkpoint), and the thread policy (threads). Imports nothing above it."""
