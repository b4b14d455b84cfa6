"""The node agent: schedule checks, push event findings at once, ship reports, spool when the
controller is away."""
