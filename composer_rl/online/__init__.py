"""Online RL: training trajectories from what the served model generated for real users."""
