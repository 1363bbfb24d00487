"""The parent, run once per job in the process ``launch.py`` starts: Hydra composition
(``compose``), every pre-flight check (``preflight``), the doctor, torchrun's argv and env
(``argv``), its process (``processes``), the verdicts before and after a run (``verdicts``), stop
signals (``signals``), the job itself (``launcher``), export checks, tracking, reports, progress,
sweeps and the Neuron setup. Nothing here runs inside a rank.
"""
