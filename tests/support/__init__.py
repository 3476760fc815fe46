"""What the tests share: the independent references (`reference`: one-device
Keras and plain loops), the harnesses that start and end real processes
(`launcher_harness`, `engine_harness`), network limits (`network_limits`)
and loading the example programs (`program_loader`)."""
