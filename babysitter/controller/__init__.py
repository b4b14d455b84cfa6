"""The controller: API, store, policy/remediation loop, alerts."""
