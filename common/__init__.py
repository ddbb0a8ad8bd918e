"""What the harness, the trainer and the wheelhouse share, below all three: how a command line
ends, which names are secrets, and writing where another local user may have been first.
Standard library only: the wheelhouse's node side imports it on bare offline nodes."""
