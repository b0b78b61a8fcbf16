"""A new user's first session, run as its own process in an empty folder by
tests/ui/test_browser_new_user.py:

    python new_user_script.py

As the README's Training section does: a small model trained with a checkpoint and a
held-out set, several steps per graph; a second training given no held-out data; a
prediction from the first's parameters, its output named. All on the embedded cluster,
which goes when the process exits; the metadata database is the default one, .deepx/deepx.db
in the folder. Prints the first training's id.
"""

import numpy as np

import deepx_flow as dx


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((240, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    model = dx.nn.Sequential(dx.nn.Linear(8, 16), dx.nn.relu, dx.nn.Linear(16, 2))

    def loss(p, xb, yb):
        return dx.nn.cross_entropy(model(p, xb), yb)

    # 20 steps, 5 to a graph: 4 graphs, each reading the same constant learning rate.
    fit = dx.train(loss, model.init(seed=0), data=(x[:200], y[:200]), batch_size=20,
                   epochs=2, steps_per_graph=5, optimizer=dx.optim.Adam(lr=3e-3),
                   eval_data=(x[200:], y[200:]), eval_every=5, checkpoint="new_user_mlp")
    dx.train(loss, model.init(seed=1), data=(x, y), batch_size=40, epochs=1,
             steps_per_graph=6)
    images = dx.input("images", x[200:].shape, "float32")
    dx.run({"scores": model(fit.params, images)}, inputs={**fit.inputs, "images": x[200:]})
    print(fit.training_id)


if __name__ == "__main__":
    main()
