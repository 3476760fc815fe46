"""What CI's short form leaves to ``--full`` (tests/conftest.py applies it).

CI (``bash .ci/run``) must end within 30 minutes on 2 cores; the whole
suite takes about 45. A test's cost is mostly TensorFlow tracing its
step functions (2 to 10 s a test, measured with ``--durations=0``), so
the only way under is to run fewer of them. The rule CI follows:

- every test function runs in CI, with at least one of its rows: the
  rows listed here are the ones CI keeps, chosen to keep the most
  composed case (several axes at once) and each distinct kind of input;
  the other rows, which vary a count, an optimizer or a schedule the kept
  row and other CI tests already cover, run with ``--full``;
- the conformance matrix's short forms (tests/conformance) keep one row
  in 3 to 8 (``THINNED_ROWS``): every zoo family still runs in CI
  through the compatibility form (every family on an uneven partial
  batch over 3 replicas, .ci/compatibility, under --conformance=full,
  which thins nothing);
- a few whole tests (``WHOLE``) run with ``--full`` only, each with the
  CI test that covers the same mechanism.

``python3 -m pytest -n 2 --full --conformance=full tests`` runs
everything (CONTRIBUTING.md).
"""

# (module, test function) -> the ids of the rows CI runs.
ONE_ROW = {
    ("test_sequence_parallel", "test_a_block_split_by_sequence_equals_one_device"):
        ("2-2-False",),
    ("test_sharded_checkpoints", "test_a_run_stopped_mid_epoch_resumes_anywhere_like_one_device"):
        ("fully sharded 2 to sharded 3, async",),
    ("test_table_lookups", "test_tables_sharded_by_rows_train_as_one_device"):
        ("adagrad-2-sqrtn",),
    ("test_table_lookups", "test_with_compression_each_routed_gradient_entry_crosses_in_16_bits"):
        ("fp16",),
    ("test_empty_replicas", "test_models_on_empty_replicas_equal_one_device"):
        ("convnet_sync_bn-4",),
    ("test_model_fully_sharded",
     "test_mlp_sliced_over_replicas_and_split_over_model_devices_equals_one_device"):
        ("sgd-True-0.05-True",),
    ("test_tensor_parallel_layers", "test_transformer_equals_one_device"):
        ("2-2-rules2-True",),
    ("test_composed_layouts", "test_pipeline_stages_fully_sharded_over_replicas_equal_one_device"):
        ("2x2-m2-b1-1f1b",),
    ("test_mixed_precision", "test_embedding_and_lstm_in_mixed_precision_equal_one_device"):
        ("mixed_float16-adam-3", "mixed_bfloat16-sgd-1"),
    ("test_pipeline", "test_a_pipeline_per_replica_equals_one_device"): ("2x2-m4-b5-1f1b",),
    ("test_pipeline", "test_a_pipeline_equals_one_device"):
        ("3stages-m4-b8-1f1b", "4stages-m8-b8-gpipe", "2stages-m1-b8-gpipe",
         "4stages-m3-b5-1f1b"),
    ("test_fully_sharded", "test_sparse_gradients_update_as_on_one_device"):
        ("adagrad-tokens_and_positions_one_table-4", "adamw-one_table_twice-2"),
    ("test_static_shapes", "test_checkpoints_cross_between_static_and_dynamic_paths"):
        ("first0-second0",),
    ("test_nested_layers",
     "test_fully_sharded_units_by_path_equal_one_device_and_make_each_block_a_unit"): ("stack",),
    ("test_local_sgd", "test_local_steps_and_averaging_equal_a_hand_written_local_sgd"):
        ("3-3-2-False",),
    ("test_fully_sharded", "test_fit_evaluate_and_predict_equal_one_device_keras"): ("adam-3",),
    ("test_checkpoint", "test_epoch_resumed_mid_way_reports_the_uninterrupted_loss_and_metrics"):
        ("4-3-True",),
    ("test_own_steps_split", "test_own_steps_on_split_weights_equal_one_device"):
        ("2-adam-0.05-True",),
    ("test_checkpoint", "test_resume_mid_epoch_from_step_checkpoint_equals_uninterrupted"):
        ("True",),
    ("test_static_shapes", "test_static_shapes_equal_single_device_keras"): ("4-66",),
    ("test_data_order", "test_resumed_run_on_a_new_dataset_object_sees_the_uninterrupted_orders"):
        ("mid-epoch",),
    ("test_model_pipeline", "test_mlp_over_stages_and_model_devices_equals_one_device"):
        ("sgd-5-True-True-0.05",),
    ("test_accumulation", "test_sparse_gradients_accumulate_exactly_or_warn_naming_the_weight"):
        ("sgd-2", "adam-3-fully_sharded"),
    ("test_data_service", "test_trainer_fit_through_the_service_equals_one_device"): ("3",),
    ("test_interleaved", "test_four_stages_on_two_devices_equal_one_device"): ("m6-b5",),
    ("test_clipping", "test_trainer_clips_the_batch_gradient"): ("global_clipnorm-4",),
    ("test_keras_fit", "test_sample_weight_validation_data_and_empty_replicas"): ("3",),
    ("test_split_accumulation", "test_accumulated_shards_equal_one_device_on_the_union_batches"):
        ("2x2-fully_sharded-adam",),
    ("test_custom_loop", "test_custom_loop_equals_single_device_keras"): ("2-70", "4-66"),
    ("test_fully_sharded", "test_clipping_clips_the_batch_gradient_as_one_device"): ("clip1-4",),
    ("test_dataset_options", "test_training_on_a_dataset_with_its_own_shard_policy_equals_one_device"):
        ("OFF",),
    ("test_tensor_parallel", "test_fit_evaluate_predict_equal_one_device"): ("2-2-adam",),
    ("test_quiet_executions",
     "test_only_executions_at_a_point_run_one_by_one_and_results_equal_keras"): ("3",),
    ("test_table_rows", "test_equals_one_device_keras"):
        ("adagrad-2", "loss_scale_adagrad-1", "momentum-2"),
    ("test_keras_overrides", "test_compute_loss_steps_equal_one_device_with_partial_batches"):
        ("3-GuideTrainStep", "1-PenaltyLoss"),
    ("test_data_order", "test_shuffled_dataset_trains_on_keras_orders"):
        ("1-initial_epoch", "1-two fit calls", "3-unknown cardinality",
         "3-repeat with steps_per_epoch"),
    ("test_exactness", "test_multi_output_loss_weights_equal_single_device"): ("4-66",),
    ("test_mixed_precision",
     "test_an_overflow_on_one_replica_skips_the_step_on_all_as_one_device_does"):
        ("tfdist step-4", "own step-2"),
    ("test_tensor_parallel_on_workers",
     "test_data_pipeline_and_model_axes_over_two_workers_equal_one_device"): ("fully_sharded",),
    ("test_exactness", "test_fit_equals_single_device_keras"): ("3-adam-66", "4-sgd-66"),
    ("test_checkpoint", "test_two_epochs_on_4_replicas_then_one_more_equals_three_on_one_device"):
        ("True-2",),
    ("test_keras_rs", "test_distributed_embedding_with_tables_sharded_by_rows_equals_one_device"):
        ("adagrad-sqrtn",),
    ("test_model_split",
     "test_fully_sharded_weights_of_a_model_built_on_its_first_batch_equal_one_device"):
        ("subclassed",),
    ("test_gossip", "test_gossip_equals_a_numpy_simulation_of_d_psgd"):
        ("exponential-4-momentum", "given-3-momentum"),
    ("test_gossip", "test_the_complete_graph_is_synchronous_sgd_on_one_device"): ("attach",),
    ("test_gossip", "test_an_exchange_is_one_pair_gather_per_neighbour_and_no_all_reduce"):
        ("exponential-gathers_per_matrix1",),
    ("test_gossip", "test_an_exchange_of_rank_valued_weights_gives_the_analytic_averages"):
        ("ring-4", "exponential-3"),
}

# Conformance matrices whose short-form rows CI thins: of each function's
# rows, in collection order, CI keeps one in every ``step`` (the first, then
# every step-th). Not under --conformance=full (the compatibility form
# runs every zoo family that way).
THINNED_ROWS = {
    ("test_zoo", "test_equals_one_device"): 8,
    ("test_sharded_state", "test_each_sharding_stage_equals_one_device"): 8,
    ("test_axes", "test_optimizer_on_gradient_pattern_equals_one_device"): 8,
    ("test_axes", "test_form_equals_one_device"): 8,
    ("test_axes", "test_input_container_equals_one_device"): 6,
    ("test_corpus", "test_published_program_equals_one_device"): 3,
    ("test_pipeline_zoo", "test_a_pipeline_equals_one_device"): 4,
    ("test_composed_zoo", "test_a_composed_layout_equals_one_device"): 3,
    ("test_tensor_parallel_zoo", "test_a_tensor_parallel_layout_equals_one_device"): 4,
    ("test_fit_options", "test_user_code_equals_one_device"): 3,
    ("test_random_layers", "test_each_replica_draws_its_own_values_the_same_every_run"): 2,
    ("test_clusters", "test_axis_on_a_cluster_equals_one_device"): 4,
    ("test_clusters", "test_cluster_equals_one_device"): 2,
}

# (module, test function) -> the CI test that covers its mechanism.
WHOLE = {
    ("test_fully_sharded", "test_freed_after_forward_at_most_two_layers_are_gathered_at_once"):
        "its numbers: every FullySharded test in CI (freeing after the forward pass is "
        "the default); this one measures the memory bound",
    ("test_checkpoint", "test_parameter_server_saves_do_not_grow_memory"):
        "the saves themselves: test_parameter_server's checkpoint of two ps (serial pass); "
        "memory growth: the soak (--full, like this test)",
    ("test_empty_replicas", "test_convnet_under_onednn_kernels"):
        "test_models_on_empty_replicas_equal_one_device[convnet_sync_bn-4]",
    ("test_table_lookups", "test_tables_sharded_over_two_workers_train_as_one_device"):
        "test_recommenders' DCN on two workers",
    ("test_custom_loop", "test_program_on_two_workers_stopped_by_sigterm_resumes_and_equals_one_device"):
        "test_multi_worker's SIGTERM test (serial pass): the same save and resume",
    ("test_program", "test_mirrored_program_keras_fit_form_trains_with_attach"):
        "test_keras_fit and the README's quickstart example (test_docs)",
    ("test_tensor_parallel_on_workers", "test_a_block_split_by_sequence_over_two_workers_equals_one_device"):
        "sequence rules in one process (test_sequence_parallel) and meshes over workers "
        "(the other tests of test_tensor_parallel_on_workers)",
    ("test_tensor_parallel_on_workers",
     "test_data_model_and_fully_sharded_over_two_workers_equal_one_device"):
        "the four axes over two workers, fully sharded (same module)",
    ("test_tensor_parallel_on_workers",
     "test_a_killed_worker_of_a_mesh_restarts_from_the_checkpoint_and_ends_equal"):
        "test_pipeline_on_tasks' SIGKILL of a stage and test_multi_worker's killed worker "
        "(serial pass): the same restart from a checkpoint",
    ("test_chaos", "test_a_seeded_fault_ends_exactly_or_with_a_named_error"):
        "each fault on its own: test_multi_worker's SIGKILL and SIGTERM tests and "
        "test_reliability's SIGSTOP test (serial pass)",
    ("test_parameter_server", "test_killed_ps_is_named_and_a_restart_resumes_from_the_checkpoint_exactly"):
        "test_parameter_server's killed worker (retried) and its checkpoint of two ps restored "
        "on one; test_multi_worker's killed worker (the launcher's restart)",
    ("test_parameter_server",
     "test_sigterm_to_the_coordinator_saves_and_the_restarted_run_resumes_exactly"):
        "test_multi_worker's SIGTERM test: the same save on a signal and resume",
    ("test_parameter_server",
     "test_workers_share_a_data_service_pass_each_example_at_most_once_per_epoch"):
        "test_multi_worker's data service worker and tests/data/test_data_service.py",
    ("test_multi_worker",
     "test_sharded_optimizer_state_on_two_workers_saves_resumes_and_equals_one_device"):
        "fully sharded over two workers: test_recommenders' DCN and test_tensor_parallel_on_workers' "
        "four axes; a sharded checkpoint resumed on another count: test_sharded_checkpoints",
    ("test_multi_worker_ctl", "test_multi_worker_ctl_tutorial_equals_one_device"):
        "Keras fit on a real cluster of two workers (test_multi_worker's attached fit, serial "
        "pass) and custom loops against one device (test_custom_loop)",
    ("test_elastic_growth", "test_the_group_shrinks_and_grows_back_with_the_discovered_workers"):
        "the launcher's resize decisions (tests/launch/test_decisions.py: discovery re-forms "
        "the group at its size) and its restart from a checkpoint (test_multi_worker's killed "
        "worker, serial pass)",
    ("test_multi_worker_keras", "test_multi_worker_keras_tutorial_equals_one_device"):
        "test_multi_worker's attached fit and predict on two workers (serial pass) and the "
        "Horovod port on two workers (test_horovod_port)",
    ("test_custom_training",
     "test_custom_training_tutorial_equals_one_device_where_the_published_loop_does_not"):
        "custom loops against one device on partial batches (test_custom_loop)",
    ("test_parameter_server_tutorial",
     "test_parameter_server_tutorial_fit_and_custom_loop_equal_one_device"):
        "test_parameter_server's one worker against one device and its local cluster "
        "(serial pass)",
    ("test_multi_worker", "test_local_sgd_on_two_workers_equals_a_hand_written_local_sgd"):
        "test_local_sgd against a hand-written local SGD over replicas (the same collectives)",
    ("test_multi_worker", "test_a_models_own_step_on_two_workers_equals_one_device"):
        "a model's own step against one device (test_keras_overrides) and attached fit on "
        "two workers (same module)",
    ("test_multi_worker", "test_two_workers_in_mixed_float16_skip_an_overflowing_step_together"):
        "an overflow on one replica skips the step on all (test_mixed_precision)",
    ("test_multi_worker", "test_two_workers_train_on_a_shuffled_dataset_as_one_device_keras_does"):
        "shuffled datasets on Keras' orders (test_data_order) and two workers against one "
        "device (same module)",
    ("test_parameter_server", "test_a_models_own_step_on_one_worker_equals_one_device"):
        "test_parameter_server's one worker against one device and a model's own step "
        "(test_keras_overrides)",
    ("test_fully_sharded", "test_mixed_precision_embedding_and_lstm_equal_one_device"):
        "test_mixed_precision's embedding and LSTM and every FullySharded test in CI",
    ("test_gossip_workers",
     "test_a_killed_worker_restarts_from_the_checkpoint_and_ends_as_the_simulation"):
        "test_multi_worker's killed worker (serial pass): the same restart from a checkpoint; "
        "gossip on two workers against the simulation (same module)",
    ("test_local_sgd", "test_mixed_precision_every_step_equals_one_device"):
        "test_mixed_precision and test_local_sgd's other tests",
    ("test_fully_sharded",
     "test_a_run_stopped_mid_accumulation_resumes_on_another_count_and_stage"):
        "test_split_accumulation's run stopped mid-accumulation and resumed under another layout",
}
