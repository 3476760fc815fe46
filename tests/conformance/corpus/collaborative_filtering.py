"""keras.io "Collaborative Filtering for Movie Recommendations": a
subclassed RecommenderNet with user and movie embeddings (L2-regularized)
and biases, their dot product through a sigmoid; Adam (lr 0.001) and
binary cross-entropy. The embeddings' sparse gradients go through Adam.

Changes: 610 users / 9742 movies -> 12 / 15, embedding size 50 -> 4,
random ratings for MovieLens, epochs 5 -> 2, lr 0.001 -> 0.01; and the
dot product: the example's ``tensordot(user_vector, movie_vector, 2)``
contracts the batch axis too, so every prediction is the sum over the
whole batch (one number for all rows). No split of the batch can equal
that (a replica sums its own rows only), and tfdist cannot see it; the
program here takes the per-row dot product the example describes.
"""

import keras
import numpy as np
from keras import layers, ops

SOURCE = "https://keras.io/examples/structured_data/collaborative_filtering_movielens/"
NUM_USERS, NUM_MOVIES, EMBEDDING_SIZE = 12, 15, 4
FIT = dict(epochs=2)


class RecommenderNet(keras.Model):
    def __init__(self, num_users, num_movies, embedding_size, **kwargs):
        super().__init__(**kwargs)
        self.user_embedding = layers.Embedding(
            num_users, embedding_size, embeddings_initializer="he_normal",
            embeddings_regularizer=keras.regularizers.l2(1e-6))
        self.user_bias = layers.Embedding(num_users, 1)
        self.movie_embedding = layers.Embedding(
            num_movies, embedding_size, embeddings_initializer="he_normal",
            embeddings_regularizer=keras.regularizers.l2(1e-6))
        self.movie_bias = layers.Embedding(num_movies, 1)

    def call(self, inputs):
        user_vector = self.user_embedding(inputs[:, 0])
        user_bias = self.user_bias(inputs[:, 0])
        movie_vector = self.movie_embedding(inputs[:, 1])
        movie_bias = self.movie_bias(inputs[:, 1])
        # test: per row (the example: ops.tensordot(user_vector, movie_vector, 2))
        dot_user_movie = ops.sum(user_vector * movie_vector, axis=1, keepdims=True)
        x = dot_user_movie + user_bias + movie_bias
        return ops.nn.sigmoid(x)


def build():
    keras.utils.set_random_seed(19)
    model = RecommenderNet(NUM_USERS, NUM_MOVIES, EMBEDDING_SIZE)
    model.build((None, 2))
    model.compile(loss=keras.losses.BinaryCrossentropy(),
                  optimizer=keras.optimizers.Adam(learning_rate=0.01))
    return model


def data(examples):
    rng = np.random.RandomState(8)
    x = np.stack([rng.randint(0, NUM_USERS, examples), rng.randint(0, NUM_MOVIES, examples)], 1)
    y = ((x[:, 0] + x[:, 1]) % 5 / 4.0).astype("float32")[:, None]
    return x.astype("int64"), y
