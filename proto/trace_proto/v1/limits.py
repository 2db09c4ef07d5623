"""Size limits of the v1 contract, in one place.

They bound the work one request can ask for and the memory one request can pin, so that a buggy or
hostile caller gets a clear 422 instead of an out-of-memory replica. The server's body-size limit
(an operator setting) caps the bytes of a request on top of these.
"""

from typing import Final

#: Characters in a client-made identifier (prompt, node, event, instruction id).
MAX_ID_LENGTH: Final = 256
#: Job names appear in URL paths and store key names, hence the restricted alphabet.
JOB_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
#: Characters in one prompt or one turn text; longer texts are the caller's bug, not signal.
MAX_TEXT_LENGTH: Final = 131_072
#: Length of a client-supplied feature vector (e.g. a pooled hidden state).
MAX_FEATURE_DIM: Final = 4_096
#: Largest training step: the largest integer a JSON number (an IEEE double) holds exactly, which is
#: also what a Redis sorted-set score stores exactly.
MAX_STEP: Final = 2**53 - 1
#: Candidate prompts in one `/v1/allocate` request.
MAX_PROMPTS_PER_REQUEST: Final = 16_384
#: Bare rollouts `M` in one allocation.
MAX_BUDGET: Final = 1_048_576
#: Upper bound for `max_rollouts` (rollouts given to one prompt).
MAX_ROLLOUTS_PER_PROMPT: Final = 4_096
#: Upper bound for the expansion multiplier `N`.
MAX_EXPANSION: Final = 64.0
#: Upper bound for the number of Stage 2 rounds.
MAX_ROUNDS: Final = 16
#: Events in one `/v1/expand` request.
MAX_EVENTS_PER_REQUEST: Final = 4_096
#: Instructions claimed by one `GET /v1/instructions`, at most and by default.
MAX_CLAIM: Final = 1_024
DEFAULT_CLAIM: Final = 64
#: Histories in one `/v1/predict` request.
MAX_HISTORIES_PER_REQUEST: Final = 4_096
#: Turns in one history: of a `/v1/predict` request, and of a rollout (the depth of a tree).
MAX_TURNS_PER_HISTORY: Final = 1_024
#: Turns over all histories of one `/v1/predict` request (each turn is encoded and scored).
MAX_TURNS_PER_PREDICT: Final = 16_384
