"""The body the image-classifier programs share: build, fit, evaluate.

`strategies/mirrored.py` and `strategies/multi_worker_mirrored.py` pick a
strategy and call `train_image_classifier`; it lives beside them (not in the
library) because it is a program: it prints, and it drives `tfdist.Trainer`.
"""

import tfdist

tfdist.import_tensorflow()  # without C++ start-up noise (TFDIST_TF_LOGS=1 shows it)

import keras  # noqa: E402

import recipes  # noqa: E402  (strategies/recipes.py: data and models of the examples)


def build_classifier(model: str, info: dict, learning_rate: float, seed: int,
                     steps_per_execution: int = 1, jit_compile: bool = False):
    """The compiled classifier (call inside the strategy's scope)."""
    keras.utils.set_random_seed(seed)
    classifier = recipes.build_model(model, info["input_shape"], info["num_classes"])
    classifier.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
        jit_compile=jit_compile,
    )
    return classifier


def train_image_classifier(strategy, *, dataset="synthetic_patterns", data_dir=None,
                           batch_size=128, model="mlp", learning_rate=1e-3, epochs=3,
                           model_dir=None, steps_per_execution=1, partial_batch=None,
                           jit_compile=False, static_shapes=None, log_every_steps=20,
                           seed=0) -> dict:
    """The body of the ``strategies/`` programs: build, fit, evaluate.

    Returns the final evaluation. Progress lines, checkpoints (resume by
    running again) and summaries follow `tfdist.Trainer`.
    """
    train, test, info = recipes.image_classification_data(
        dataset, global_batch_size=batch_size, data_dir=data_dir, seed=seed
    )
    with strategy.scope():
        classifier = build_classifier(model, info, learning_rate, seed,
                                      steps_per_execution=steps_per_execution,
                                      jit_compile=jit_compile)
    trainer = tfdist.Trainer(classifier, strategy, static_shapes=static_shapes,
        checkpointing=tfdist.CheckpointOptions(model_dir),
        input_pipeline=tfdist.DataOptions(partial_batch=partial_batch, global_batch_size=batch_size),
        reporting=tfdist.ReportingOptions(log_every_steps=log_every_steps))
    if getattr(strategy.extended, "should_checkpoint", True):
        print(f"{strategy.num_replicas_in_sync} replicas | {dataset}: "
              f"{info['train_examples']} training examples | global batch {batch_size}",
              flush=True)
    trainer.fit(train, epochs=epochs, validation_data=test)
    results = trainer.evaluate(test)
    if getattr(strategy.extended, "should_checkpoint", True):
        print("final | " + " | ".join(f"{k} {v:.4f}" for k, v in results.items()), flush=True)
    return results


def keras_fit_image_classifier(strategy, *, dataset="synthetic_patterns", data_dir=None,
                               batch_size=128, model="mlp", learning_rate=1e-3, epochs=3,
                               seed=0, verbose=2):
    """The same training as a plain Keras script: arrays and ``model.fit``.

    The Keras code below is what a user already has; ``tfdist.attach`` is the
    one added line, and makes it exact under ``strategy``.
    """
    import numpy as np  # pylint: disable=import-outside-toplevel

    _, test, info = recipes.image_classification_data(
        dataset, global_batch_size=batch_size, data_dir=data_dir, seed=seed)
    rows = list(tfdist.data.datasets.load_supervised(dataset, "train", data_dir=data_dir)
                .as_numpy_iterator())
    x_train = np.stack([x for x, _ in rows]).astype("float32") / 255.0
    y_train = np.array([y for _, y in rows])
    with strategy.scope():
        classifier = build_classifier(model, info, learning_rate, seed)
    tfdist.attach(classifier, strategy)  # the one tfdist line

    classifier.fit(x_train, y_train, batch_size=batch_size, epochs=epochs,
                   validation_split=0.1, shuffle=True, verbose=verbose)
    loss, accuracy = classifier.evaluate(test, verbose=0)
    predictions = classifier.predict(test, verbose=0)
    if getattr(strategy.extended, "should_checkpoint", True):
        print(f"final | loss {loss:.4f} | accuracy {accuracy:.4f} | "
              f"predictions {predictions.shape}", flush=True)
    return loss, accuracy
