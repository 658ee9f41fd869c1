"""runtime: what minibpd's decode loop is handed and stands on (docs/layout.md, "The folders"):
the lab's entry to the loop, the drafter contract, the cache, sampling, Stern §5's rules, tree
verification, checkpoints and text, the thread policy. Imports nothing above it."""
