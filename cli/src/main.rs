//! The `exactly` command.

fn main() {
    println!("exactly {}", env!("CARGO_PKG_VERSION"));
}
