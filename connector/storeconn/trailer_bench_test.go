package storeconn

import (
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
)

// BenchmarkTrailer times sealing and checking one block's trailer, as a
// save and a load each do, with verify "checksum" (CRC-32 and the key's
// FNV-1a) and verify "mac" (keyed BLAKE3 over the key and the block),
// alternating the two in every iteration, for blocks of 256 KiB and
// 2 MiB; it reports each mode's GB/s of block bytes and mac/checksum, the
// ratio of their speeds.
func BenchmarkTrailer(b *testing.B) {
	for _, c := range []struct {
		name string
		size int
	}{{"256KiB", 256 << 10}, {"2MiB", 2 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			m, err := rdma.AllocHost(c.size)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { m.Free() })
			for i, p := 0, m.Bytes(); i < len(p); i++ {
				p[i] = byte(i * 7)
			}
			spans := []rdma.Region{m.Region()}
			s, err := parseSecret("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", "test")
			if err != nil {
				b.Fatal(err)
			}
			h := s.keyed()
			const key = "tenant/model/0123456789abcdef0123456789abcdef"
			var crcT, macT time.Duration
			var crcTr [trailerLen]byte
			var macTr [macTrailerLen]byte
			for b.Loop() {
				t0 := time.Now()
				putTrailer(crcTr[:], key, c.size, blockCRC(spans))
				if err := checkTrailer(crcTr[:], key, c.size, spans); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				putMAC(macTr[:], h, key, c.size, spans)
				if err := checkMAC(macTr[:], h, key, c.size, spans); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				crcT += t1.Sub(t0)
				macT += t2.Sub(t1)
			}
			bytes := 2 * float64(b.N) * float64(c.size)
			b.ReportMetric(bytes/crcT.Seconds()/1e9, "checksum-GB/s")
			b.ReportMetric(bytes/macT.Seconds()/1e9, "mac-GB/s")
			b.ReportMetric(crcT.Seconds()/macT.Seconds(), "mac/checksum")
		})
	}
}
