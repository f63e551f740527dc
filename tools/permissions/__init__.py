"""Who decides what runs: approval modes and rules (approval.py), the policy (policy.py), shell lines judged (shell_rules.py)."""
