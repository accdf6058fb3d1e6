// Package guides holds the Go code that the guides in docs/ show, so that
// it compiles as shown: its test checks that every Go block of README.md
// and docs/*.md is the text between a "guide:begin" marker and the next
// "guide:end" marker of this package or of examples/engineloop (less the
// indentation of its first line). The functions are sketches of where
// each call goes, not programs: examples/miniengine runs them.
package guides
