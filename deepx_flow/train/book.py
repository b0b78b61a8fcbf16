"""A training's book-keeping: its rows in the metadata database (the training, its metrics
per step, the runs it submitted) and its checkpoints (`train.checkpoint`); what needs no
database is a no-op when recording is off."""

from __future__ import annotations

import uuid

from deepx_flow.config import settings
from deepx_flow.errors import GraphError, shown


class Book:
    """The training's records and checkpoints in the metadata database; a no-op for what
    needs no database when recording is off."""

    def __init__(self, db, training_id, asset, config):
        self.db, self.training_id, self.asset, self.config = db, training_id, asset, config
        self.resumed_step = 0
        self.saved_step = None
        self.resumed_from = None

    @classmethod
    def open(cls, db, asset, step, seed, batch_size, dataset, optimizer, epochs, steps,
             window_blocks):
        from deepx_flow.meta import open_db
        from deepx_flow.train import checkpoint as ckpt
        from deepx_flow.train import records
        config = ckpt.config_hash(step, optimizer, seed, batch_size, dataset.token,
                                  window_blocks)
        if not settings().record and asset is None:
            return cls(None, None, None, config)
        database = open_db(db)
        training_id = uuid.uuid4().hex
        records.begin(database, records.new_training(
            training_id, asset=asset, config_hash=config, optimizer=repr(optimizer),
            seed=seed, batch_size=batch_size, epochs=epochs, steps=steps))
        return cls(database, training_id, asset, config)

    def resume_values(self, steps: int, in_place: bool = False):
        """The arrays of the newest checkpoint of this configuration (`in_place`: sources
        that read them region by region where they are used), or None; a checkpoint past
        the `steps` this run plans is an error (it would end where it never got)."""
        from deepx_flow.train import checkpoint as ckpt
        from deepx_flow.train import records
        if self.db is None or self.asset is None:
            return None
        row = records.latest_checkpoint(self.db, self.asset, self.config)
        if row is None:
            return None
        if row.step > steps:
            raise GraphError(f"the newest checkpoint in asset {shown(self.asset)} is after step "
                             f"{row.step}, past the {steps} steps this run plans; train for "
                             "more epochs, or start afresh with resume=False")
        self.resumed_step, self.resumed_from = row.step, row.version
        self.saved_step = row.step
        from sqlalchemy import update
        from deepx_flow.meta.models import Training
        with self.db.begin() as conn:
            conn.execute(update(Training).where(Training.id == self.training_id)
                         .values(resumed_from=row.version, steps_done=row.step))
        return ckpt.sources(self.db, row) if in_place else ckpt.read(self.db, row)

    def metrics(self, rows, steps_done=None):
        if self.db is not None and self.training_id is not None:
            from deepx_flow.train import records
            records.add_metrics(self.db, self.training_id, rows, steps_done)

    def rewind(self, done: int) -> None:
        """Forget the metrics of the steps after `done` (they are taken again)."""
        if self.db is not None and self.training_id is not None:
            from deepx_flow.train import records
            records.forget_after(self.db, self.training_id, done)

    def link(self, run_id):
        if self.db is not None and self.training_id is not None:
            from deepx_flow.train import records
            records.link_run(self.db, run_id, self.training_id)

    def end(self, status, error=None):
        if self.db is not None and self.training_id is not None:
            from deepx_flow.train import records
            try:
                records.end(self.db, self.training_id, status, error)
            except Exception:  # the training's own outcome matters more than its row
                if status == "succeeded":
                    raise


class Saver:
    """Writes checkpoints: the packing graph compiled once, run on the latest values."""

    def __init__(self, book, step, spec, client):
        from deepx_flow.assets.gc import collect_before_writing
        from deepx_flow.runtime.plan_cache import cached_compile
        from deepx_flow.train import checkpoint as ckpt
        self.book, self.client = book, client
        collect_before_writing(book.db, [book.asset])  # what killed checkpoints left
        self.pack = ckpt.packing(step)
        self.plan = cached_compile(self.pack.graph, spec, settings())

    def save(self, runner, planned) -> str:
        from deepx_flow.train import checkpoint as ckpt
        version = ckpt.write(self.book.db, self.client, self.plan, self.pack,
                             runner.current_inputs(), self.book.asset, self.book.training_id,
                             planned.number, planned.epoch, self.book.config)
        self.book.saved_step = planned.number
        return version
