"""A language-model learner: a small transformer policy trained by GRPO on multi-turn tool tasks through the
real service."""
