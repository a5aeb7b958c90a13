//! Instruction count of one 16-float message, sent and received in one process (for
//! `valgrind --tool=callgrind`): `callgrind16 N` sends and receives N self-describing
//! messages; `callgrind16 N typed` sends and receives N values on a typed `[f32; 16]` channel
//! (`Sender<[f32; 16]>::send` + `Receiver<[f32; 16]>::recv`). Per message:
//! `(Ir(N = 21000) - Ir(N = 1000)) / 20000`.
use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender};

fn main() -> Result<(), shm_ring::Error> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let mode = std::env::args().nth(2);
    let typed = mode.as_deref() == Some("typed");
    let name = format!("callgrind16-{}", std::process::id());
    let mut data = [0f32; 16];
    let mut total = 0f64;
    if typed {
        let mut tx = Sender::<[f32; 16]>::create(&name, &ChannelConfig::default())?;
        let mut rx = Receiver::<[f32; 16]>::open(&name)?;
        for seq in 0..n {
            data[0] = seq as f32;
            tx.send(&data)?;
            total += rx.recv()?.iter().sum::<f32>() as f64;
        }
    } else {
        let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default())?;
        let mut rx = Receiver::<Message>::open(&name)?;
        for seq in 0..n {
            data[0] = seq as f32;
            tx.send(
                MessageBuilder::new()
                    .tag(seq as u32)
                    .array_slice("x", &[16], &data)?,
            )?;
            rx.recv_batch(64, None, |m| {
                if let Ok(a) = m.record(0).and_then(|r| r.array::<f32>("x")) {
                    total += a.sum() as f64;
                }
            })?;
        }
    }
    println!("{n} messages, sum {total}");
    Ok(())
}
