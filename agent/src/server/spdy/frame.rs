//! SPDY/3 frames: their wire layout, and the header blocks, compressed
//! with zlib over the protocol's preset dictionary (one compression
//! context per direction for the life of the connection, each block
//! ended with a sync flush, as Go's framer writes them).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use thiserror::Error;

pub const VERSION: u16 = 3;
/// The largest payload one frame can carry (24-bit length).
pub const MAX_FRAME_PAYLOAD: usize = (1 << 24) - 1;
/// Header blocks larger than this are refused: the streaming protocols
/// send a handful of short headers.
const MAX_HEADER_BLOCK: usize = 1 << 20;

pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes used here.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_REFUSED_STREAM: u32 = 3;
pub const RST_CANCEL: u32 = 5;

/// Header names (lower case) and values; a name may repeat.
pub type Headers = Vec<(String, String)>;

/// The value of `name` in `headers`, if present.
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings,
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
    /// A control frame of a type SPDY/3 does not define (ignored, as the
    /// spec asks).
    Unknown {
        frame_type: u16,
    },
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("SPDY version {0} is not supported (only 3)")]
    Version(u16),
    #[error("SPDY {what} frame of {len} bytes is too short")]
    Short { what: &'static str, len: usize },
    #[error("SPDY header block: {0}")]
    HeaderBlock(String),
    #[error("SPDY frame of {0} bytes is too large")]
    TooLarge(usize),
}

/// The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1):
/// length-prefixed words, then a tail of status lines, dates and types.
pub fn dictionary() -> &'static [u8] {
    static DICT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
            "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
            "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
            "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
            "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
            "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
            "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        );
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// One direction's header compression context.
pub struct HeaderEncoder {
    z: Compress,
}

impl Default for HeaderEncoder {
    fn default() -> Self {
        let mut z = Compress::new(Compression::best(), true);
        // A fresh zlib stream always accepts a dictionary.
        let _ = z.set_dictionary(dictionary());
        HeaderEncoder { z }
    }
}

impl HeaderEncoder {
    /// The compressed header block of `headers` (names lower-cased,
    /// repeated names joined with NUL as one entry).
    pub fn encode(&mut self, headers: &Headers) -> Result<Vec<u8>, FrameError> {
        let mut merged: Vec<(String, String)> = vec![];
        for (n, v) in headers {
            let n = n.to_ascii_lowercase();
            match merged.iter_mut().find(|(m, _)| *m == n) {
                Some((_, existing)) => {
                    existing.push('\0');
                    existing.push_str(v);
                }
                None => merged.push((n, v.clone())),
            }
        }
        let mut raw = BytesMut::new();
        raw.put_u32(merged.len() as u32);
        for (n, v) in &merged {
            raw.put_u32(n.len() as u32);
            raw.put_slice(n.as_bytes());
            raw.put_u32(v.len() as u32);
            raw.put_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input: &[u8] = &raw;
        loop {
            out.reserve(256);
            let before_in = self.z.total_in();
            self.z
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| FrameError::HeaderBlock(format!("compressing: {e}")))?;
            let used = (self.z.total_in() - before_in) as usize;
            input = &input[used..];
            // A sync flush is complete once all input is taken and the
            // output buffer was not filled.
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }
}

/// The other direction's decompression context.
pub struct HeaderDecoder {
    z: Decompress,
}

impl Default for HeaderDecoder {
    fn default() -> Self {
        HeaderDecoder { z: Decompress::new(true) }
    }
}

impl HeaderDecoder {
    pub fn decode(&mut self, block: &[u8]) -> Result<Headers, FrameError> {
        let bad = |why: String| FrameError::HeaderBlock(why);
        let mut out: Vec<u8> = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(256));
            }
            let before_in = self.z.total_in();
            let before_out = out.len();
            let r = self.z.decompress_vec(input, &mut out, FlushDecompress::Sync);
            let used = (self.z.total_in() - before_in) as usize;
            input = &input[used..];
            match r {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.z.set_dictionary(dictionary()).map_err(|e| bad(format!("dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(bad(format!("decompressing: {e}"))),
            }
            if out.len() > MAX_HEADER_BLOCK {
                return Err(bad(format!("more than {MAX_HEADER_BLOCK} bytes")));
            }
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            if used == 0 && out.len() == before_out && out.len() < out.capacity() {
                return Err(bad("the compressed block is truncated".into()));
            }
        }
        parse_header_block(&out)
    }
}

fn parse_header_block(mut b: &[u8]) -> Result<Headers, FrameError> {
    let bad = |why: &str| FrameError::HeaderBlock(why.to_owned());
    let take_u32 = |b: &mut &[u8]| -> Result<u32, FrameError> {
        if b.len() < 4 {
            return Err(bad("truncated length"));
        }
        Ok(b.get_u32())
    };
    let take_str = |b: &mut &[u8], n: u32| -> Result<String, FrameError> {
        let n = n as usize;
        if b.len() < n {
            return Err(bad("truncated name or value"));
        }
        let s = String::from_utf8_lossy(&b[..n]).into_owned();
        b.advance(n);
        Ok(s)
    };
    let count = take_u32(&mut b)?;
    let mut headers = vec![];
    for _ in 0..count {
        let n = take_u32(&mut b)?;
        let name = take_str(&mut b, n)?.to_ascii_lowercase();
        let n = take_u32(&mut b)?;
        let value = take_str(&mut b, n)?;
        for v in value.split('\0') {
            headers.push((name.clone(), v.to_owned()));
        }
    }
    Ok(headers)
}

/// How long the frame at the start of `buf` is (header included), once
/// its 8-byte header is there.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= 8).then(|| 8 + (u32::from_be_bytes([0, buf[5], buf[6], buf[7]]) as usize))
}

/// Decodes one whole frame (`buf` is exactly [`frame_len`] bytes).
pub fn decode(buf: Bytes, headers: &mut HeaderDecoder) -> Result<Frame, FrameError> {
    let mut b = buf;
    let first = b.get_u32();
    let flags = b[0];
    b.advance(4);
    if first & 0x8000_0000 == 0 {
        return Ok(Frame::Data { stream_id: first & 0x7fff_ffff, flags, data: b });
    }
    let version = ((first >> 16) & 0x7fff) as u16;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let frame_type = (first & 0xffff) as u16;
    let need = |what: &'static str, n: usize, b: &Bytes| {
        if b.len() < n { Err(FrameError::Short { what, len: b.len() }) } else { Ok(()) }
    };
    Ok(match frame_type {
        TYPE_SYN_STREAM => {
            need("SYN_STREAM", 10, &b)?;
            let stream_id = b.get_u32() & 0x7fff_ffff;
            let associated_to = b.get_u32() & 0x7fff_ffff;
            let priority = b.get_u8() >> 5;
            b.advance(1);
            Frame::SynStream { stream_id, associated_to, priority, flags, headers: headers.decode(&b)? }
        }
        TYPE_SYN_REPLY => {
            need("SYN_REPLY", 4, &b)?;
            let stream_id = b.get_u32() & 0x7fff_ffff;
            Frame::SynReply { stream_id, flags, headers: headers.decode(&b)? }
        }
        TYPE_HEADERS => {
            need("HEADERS", 4, &b)?;
            let stream_id = b.get_u32() & 0x7fff_ffff;
            Frame::Headers { stream_id, flags, headers: headers.decode(&b)? }
        }
        TYPE_RST_STREAM => {
            need("RST_STREAM", 8, &b)?;
            Frame::RstStream { stream_id: b.get_u32() & 0x7fff_ffff, status: b.get_u32() }
        }
        TYPE_SETTINGS => Frame::Settings,
        TYPE_PING => {
            need("PING", 4, &b)?;
            Frame::Ping { id: b.get_u32() }
        }
        TYPE_GOAWAY => {
            need("GOAWAY", 4, &b)?;
            let last_good_stream_id = b.get_u32() & 0x7fff_ffff;
            let status = if b.len() >= 4 { b.get_u32() } else { 0 };
            Frame::GoAway { last_good_stream_id, status }
        }
        TYPE_WINDOW_UPDATE => {
            need("WINDOW_UPDATE", 8, &b)?;
            Frame::WindowUpdate { stream_id: b.get_u32() & 0x7fff_ffff, delta: b.get_u32() & 0x7fff_ffff }
        }
        other => Frame::Unknown { frame_type: other },
    })
}

fn control(out: &mut BytesMut, frame_type: u16, flags: u8, len: usize) -> Result<(), FrameError> {
    if len > MAX_FRAME_PAYLOAD {
        return Err(FrameError::TooLarge(len));
    }
    out.put_u16(0x8000 | VERSION);
    out.put_u16(frame_type);
    out.put_u32((u32::from(flags) << 24) | len as u32);
    Ok(())
}

/// Appends the encoding of `frame` to `out`.
pub fn encode(frame: &Frame, headers: &mut HeaderEncoder, out: &mut BytesMut) -> Result<(), FrameError> {
    match frame {
        Frame::SynStream { stream_id, associated_to, priority, flags, headers: h } => {
            let block = headers.encode(h)?;
            control(out, TYPE_SYN_STREAM, *flags, 10 + block.len())?;
            out.put_u32(*stream_id & 0x7fff_ffff);
            out.put_u32(*associated_to & 0x7fff_ffff);
            out.put_u8((priority & 0x7) << 5);
            out.put_u8(0);
            out.put_slice(&block);
        }
        Frame::SynReply { stream_id, flags, headers: h } | Frame::Headers { stream_id, flags, headers: h } => {
            let t = if matches!(frame, Frame::SynReply { .. }) { TYPE_SYN_REPLY } else { TYPE_HEADERS };
            let block = headers.encode(h)?;
            control(out, t, *flags, 4 + block.len())?;
            out.put_u32(*stream_id & 0x7fff_ffff);
            out.put_slice(&block);
        }
        Frame::RstStream { stream_id, status } => {
            control(out, TYPE_RST_STREAM, 0, 8)?;
            out.put_u32(*stream_id & 0x7fff_ffff);
            out.put_u32(*status);
        }
        Frame::Settings => {
            control(out, TYPE_SETTINGS, 0, 4)?;
            out.put_u32(0);
        }
        Frame::Ping { id } => {
            control(out, TYPE_PING, 0, 4)?;
            out.put_u32(*id);
        }
        Frame::GoAway { last_good_stream_id, status } => {
            control(out, TYPE_GOAWAY, 0, 8)?;
            out.put_u32(*last_good_stream_id & 0x7fff_ffff);
            out.put_u32(*status);
        }
        Frame::WindowUpdate { stream_id, delta } => {
            control(out, TYPE_WINDOW_UPDATE, 0, 8)?;
            out.put_u32(*stream_id & 0x7fff_ffff);
            out.put_u32(*delta & 0x7fff_ffff);
        }
        Frame::Data { stream_id, flags, data } => {
            if data.len() > MAX_FRAME_PAYLOAD {
                return Err(FrameError::TooLarge(data.len()));
            }
            out.put_u32(*stream_id & 0x7fff_ffff);
            out.put_u32((u32::from(*flags) << 24) | data.len() as u32);
            out.put_slice(data);
        }
        Frame::Unknown { .. } => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_the_drafts() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert!(d.starts_with(b"\0\0\0\x07options\0\0\0\x04head"));
        assert!(d.ends_with(b"utf-,*,enq=0."));
    }

    fn round_trip(frames: &[Frame]) -> Vec<Frame> {
        let (mut enc, mut dec) = (HeaderEncoder::default(), HeaderDecoder::default());
        let mut buf = BytesMut::new();
        for f in frames {
            encode(f, &mut enc, &mut buf).unwrap();
        }
        let mut out = vec![];
        while let Some(n) = frame_len(&buf) {
            if buf.len() < n {
                break;
            }
            out.push(decode(buf.split_to(n).freeze(), &mut dec).unwrap());
        }
        assert!(buf.is_empty(), "{} bytes left", buf.len());
        out
    }

    #[test]
    fn frames_round_trip_with_one_compression_context_per_direction() {
        let h = |pairs: &[(&str, &str)]| -> Headers {
            pairs.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
        };
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: h(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 0,
                flags: FLAG_FIN,
                headers: h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]),
            },
            Frame::SynReply { stream_id: 1, flags: 0, headers: vec![] },
            Frame::Data { stream_id: 3, flags: FLAG_FIN, data: Bytes::from_static(b"hello") },
            Frame::Ping { id: 1 },
            Frame::RstStream { stream_id: 3, status: RST_CANCEL },
            Frame::WindowUpdate { stream_id: 3, delta: 100 },
            Frame::GoAway { last_good_stream_id: 3, status: 0 },
            Frame::Headers { stream_id: 1, flags: FLAG_FIN, headers: h(&[("a", "1")]) },
        ];
        assert_eq!(round_trip(&frames), frames);
    }

    #[test]
    fn repeated_names_travel_as_one_nul_joined_entry() {
        let mut enc = HeaderEncoder::default();
        let mut dec = HeaderDecoder::default();
        let headers: Headers = vec![("X-A".into(), "1".into()), ("x-a".into(), "2".into()), ("b".into(), "".into())];
        let got = dec.decode(&enc.encode(&headers).unwrap()).unwrap();
        assert_eq!(got, vec![("x-a".to_owned(), "1".to_owned()), ("x-a".into(), "2".into()), ("b".into(), "".into())]);
        assert_eq!(header(&got, "X-A"), Some("1"));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut dec = HeaderDecoder::default();
        assert!(dec.decode(b"\x78\xbb garbage").is_err());
        let short = Bytes::from_static(&[0x80, 0x03, 0x00, 0x01, 0, 0, 0, 2, 0, 1]);
        assert!(matches!(decode(short, &mut dec), Err(FrameError::Short { .. })));
        let v2 = Bytes::from_static(&[0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1]);
        assert_eq!(decode(v2, &mut dec), Err(FrameError::Version(2)));
        let unknown = Bytes::from_static(&[0x80, 0x03, 0x00, 0x0a, 0, 0, 0, 0]);
        assert_eq!(decode(unknown, &mut dec), Ok(Frame::Unknown { frame_type: 10 }));
    }
}
