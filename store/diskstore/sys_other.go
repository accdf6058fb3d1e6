//go:build !linux

package diskstore

import (
	"errors"
	"os"
)

const supported = false

func openDirect(string) (*os.File, error) { return nil, errors.ErrUnsupported }

func lockFile(*os.File) error { return errors.ErrUnsupported }

func vecIO(bool, *os.File, [][]byte, int64) (int, error) { return 0, errors.ErrUnsupported }

func isNoSpace(error) bool { return false }

func inPageCache(*os.File, int64, int64) bool { return false }
