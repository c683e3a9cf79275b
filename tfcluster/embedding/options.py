"""What an embedding variable is told: how new rows start, when an id is admitted, when a row is evicted.

The names and parameters are DeepRec's (``tf.EmbeddingVariableOption``,
``tf.InitializerOption``, ``tf.CounterFilter``, ``tf.GlobalStepEvict``,
``tf.L2WeightEvict``: DeepRec-AI/DeepRec docs/docs_en/Embedding-Variable.md),
so a DeepRec program's options mean here what they meant there. Its storage
tiers and other DeepRec-only options are refused in one line (:func:`refuse`).
Nothing here imports TensorFlow.
"""

from dataclasses import dataclass, field
from typing import Optional

from ..core.errors import SpecError

#: DeepRec's default: the rows a new id's row is taken from (``id mod default_value_dim``).
DEFAULT_VALUE_DIM = 4096


@dataclass(frozen=True)
class InitializerOption:
    """How a new id's row starts: row ``id mod default_value_dim`` of one matrix drawn by ``initializer``.

    ``default_value_no_permission``: what the lookup of an id not yet admitted reads (no row is trained for it).
    """
    initializer: object = None
    default_value_dim: int = DEFAULT_VALUE_DIM
    default_value_no_permission: float = 0.0

    def __post_init__(self):
        if int(self.default_value_dim) < 1:
            raise SpecError(f"default_value_dim must be at least 1, not {self.default_value_dim}")


@dataclass(frozen=True)
class CounterFilter:
    """Admit an id once it was looked up ``filter_freq`` times in training (0 or 1: at once)."""
    filter_freq: int = 0

    def __post_init__(self):
        if int(self.filter_freq) < 0:
            raise SpecError(f"filter_freq must be 0 or more, not {self.filter_freq}")


@dataclass(frozen=True)
class CBFFilter:
    """DeepRec's counting Bloom filter admission; served as the exact :class:`CounterFilter` of the same
    ``filter_freq`` (its sizing parameters only trade memory for false admissions)."""
    filter_freq: int = 0
    max_element_size: int = 0
    false_positive_probability: float = -1.0
    counter_type: object = None

    def __post_init__(self):
        if int(self.filter_freq) < 0:
            raise SpecError(f"filter_freq must be 0 or more, not {self.filter_freq}")


@dataclass(frozen=True)
class GlobalStepEvict:
    """At each save, drop the rows no training lookup touched in the last ``steps_to_live`` global steps."""
    steps_to_live: Optional[int] = None

    def __post_init__(self):
        if self.steps_to_live is not None and int(self.steps_to_live) < 1:
            raise SpecError(f"steps_to_live must be at least 1, not {self.steps_to_live}")


@dataclass(frozen=True)
class L2WeightEvict:
    """At each save, drop the rows whose weights' L2 norm is below ``l2_weight_threshold``."""
    l2_weight_threshold: float = -1.0


@dataclass(frozen=True)
class EmbeddingVariableOption:
    """An embedding variable's options: ``init_option``, ``filter_option``, ``evict_option`` (DeepRec's)."""
    init_option: InitializerOption = field(default_factory=InitializerOption)
    filter_option: Optional[object] = None
    evict_option: Optional[object] = None
    ht_type: str = ""
    ht_partition_num: int = 1000
    storage_option: object = None
    ckpt: object = None

    def __post_init__(self):
        if self.storage_option is not None:
            refuse("storage_option (DeepRec's DRAM/PMEM/SSD tiers)")
        if self.ckpt is not None:
            refuse("ckpt (DeepRec's checkpoint option)")
        if self.ht_type not in ("", "dense_hash_map"):
            refuse(f"ht_type={self.ht_type!r}")
        if self.filter_option is not None and not isinstance(self.filter_option, (CounterFilter, CBFFilter)):
            raise SpecError(f"filter_option must be a CounterFilter or CBFFilter, "
                            f"not {type(self.filter_option).__name__}")
        if self.evict_option is not None and not isinstance(self.evict_option, (GlobalStepEvict, L2WeightEvict)):
            raise SpecError(f"evict_option must be a GlobalStepEvict or L2WeightEvict, "
                            f"not {type(self.evict_option).__name__}")

    @property
    def filter_freq(self) -> int:
        """Lookups before an id is admitted (0: at once)."""
        return int(self.filter_option.filter_freq) if self.filter_option is not None else 0

    @property
    def steps_to_live(self) -> Optional[int]:
        """The global steps a row lives untouched before a save evicts it (None: never)."""
        e = self.evict_option
        return int(e.steps_to_live) if isinstance(e, GlobalStepEvict) and e.steps_to_live else None

    @property
    def l2_weight_threshold(self) -> Optional[float]:
        """The L2 norm below which a save evicts a row (None: never)."""
        e = self.evict_option
        return float(e.l2_weight_threshold) if isinstance(e, L2WeightEvict) and e.l2_weight_threshold > 0 else None


def refuse(what: str):
    """One line for a DeepRec option tfcluster does not serve."""
    raise SpecError(f"embedding variables: {what} is DeepRec's own and not served by tfcluster "
                    f"(docs/embeddings.md, \"Embedding variables\"); rows live in the ps's memory")
