module sandpod.dev/runner

go 1.24
