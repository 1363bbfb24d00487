"""Both sides: what the parent and the ranks agree on (``contract``: torchrun's entry points, the
environment, a run directory's files and their one reader), the lifeline that ties a child to its
parent, the verdict gate ranks wait at, and the stop-file protocol. The standard library only: a
rank imports these before torch.
"""
