"""What a placement of one parameter costs: the bytes each worker keeps of it, its gradient
and its optimizer state; the bytes it holds for a moment (a whole copy gathered while a step
uses it); and the collectives a step needs. One strategy per file beside this one."""

from __future__ import annotations

from deepx_flow.compiler.placing.params import TrainedParameter


class Strategy:
    name = ""
    # Whether its pieces' axis is chunked alike through the arithmetic that reads the
    # parameter (tensor parallel); otherwise the step gathers it (`gather.py`).
    splits_arithmetic = False

    def applies(self, p: TrainedParameter, workers: int) -> bool:
        return True

    def kept(self, p: TrainedParameter, workers: int) -> float:
        """Bytes of the parameter, its gradient and its state each worker keeps."""
        raise NotImplementedError

    def gathered(self, p: TrainedParameter, workers: int) -> float:
        """Bytes held for a moment while a step uses it (one parameter at a time)."""
        return 0.0

    def collectives(self, p: TrainedParameter, workers: int) -> list[tuple[str, float]]:
        """The step's collectives for it: (kind, bytes of the tensor), per step."""
        raise NotImplementedError

    def axis(self, p: TrainedParameter, workers: int) -> int | None:
        """The axis it is split along (None: not split)."""
        return None
