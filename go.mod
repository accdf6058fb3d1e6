module github.com/kvconnect/kvconnect

go 1.26

require (
	github.com/ebitengine/purego v0.11.3
	github.com/google/go-cmp v0.7.0
	github.com/zeebo/blake3 v0.2.4
	pgregory.net/rapid v1.3.0
)

require github.com/klauspost/cpuid/v2 v2.0.12 // indirect
