"""What the harness, the trainer and the wheelhouse share, below all three: how a command line
ends, which names are secrets, writing where another local user may have been first, and a
file's sha256.
Standard library only: the wheelhouse's node side imports it on bare offline nodes."""
