"""The loop's steps, one module each: rollout, rewards, advantages, log-probs, update."""
