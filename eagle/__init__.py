"""Training the EAGLE head: its data (the target's own continuations and features), every
position's draft chain in a few batched passes, the losses and the training loop. The shipped
head and its training story are in eagle/data/. torch-only."""
