"""The healing episode as a state machine: the phases and their transitions as data
(states.py), one function per transition (one module per phase)."""
