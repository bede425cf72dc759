"""Everything that touches mlx and mlx-lm lives in this package.

Importing it first puts a fast BLAS in the process's global symbol scope, because MLX's
CPU matmuls bind to whatever BLAS is visible when ``mlx.core`` loads (ADR 0004), tunes
malloc so freed KV memory is reused without page faults (``memory.py``), and has MLX build
its compiled kernels for this CPU (``jit.py``, ADR 0012). That is the one piece of
import-time work in the codebase, and it is idempotent.
"""

from semantic.adapters.mlx.blas import preload_fast_blas
from semantic.adapters.mlx.jit import use_native_jit
from semantic.adapters.mlx.memory import tune_malloc

tune_malloc()
preload_fast_blas()
use_native_jit()
