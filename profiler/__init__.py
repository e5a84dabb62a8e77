"""Real forward-pass timing, drafters and the live engine (torch). Not built yet: see the issues."""
