; Inno Setup 6 script: a per-user Windows installer for the PyInstaller bundle in dist\rentune.
; Built by `make dist` on Windows (installers/build_dist.py passes /DAppVersion and /O<dist>). No administrator rights:
; it installs under %LOCALAPPDATA%\Programs\Rentune, adds a Start menu entry and registers an uninstaller.
; Code signing: set SignTool in Inno Setup (see installers/README.md); no certificate is kept in this repository.

#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif

[Setup]
AppId={{6F4B7C0E-2D7A-4B0B-9D54-5E1E7A0C2B61}
AppName=Rentune
AppVersion={#AppVersion}
AppPublisher=Rentune
DefaultDirName={localappdata}\Programs\Rentune
DefaultGroupName=Rentune
PrivilegesRequired=lowest
DisableProgramGroupPage=yes
OutputBaseFilename=Rentune-{#AppVersion}-windows-setup
SetupIconFile=..\..\build\icons\rentune.ico
UninstallDisplayIcon={app}\rentune.exe
Compression=lzma2
SolidCompression=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible

[Files]
Source: "..\..\dist\rentune\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{userprograms}\Rentune"; Filename: "{app}\rentune.exe"
Name: "{userdesktop}\Rentune"; Filename: "{app}\rentune.exe"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "Create a desktop shortcut"; Flags: unchecked

[Run]
Filename: "{app}\rentune.exe"; Description: "Start Rentune"; Flags: nowait postinstall skipifsilent
