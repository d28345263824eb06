module github.com/logbus/logbus/examples/engine

go 1.26.0

require (
	github.com/logbus/logbus v0.3.0
	go.uber.org/goleak v1.3.0
)

require golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4 // indirect
